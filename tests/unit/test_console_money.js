// The console page's money() (worker/roles/console_web/money.js) against the
// cases chargectl's formatter is tested with (money_cases.txt): the page and
// the CLI write money the same way.
"use strict";
const fs = require("fs");
const path = require("path");

const root = process.env.CHARGED_SOURCE_DIR || path.join(__dirname, "..", "..");
const { money } = require(path.join(root, "worker", "roles", "console_web", "money.js"));
const lines = fs.readFileSync(path.join(__dirname, "money_cases.txt"), "utf8").split("\n");
let cases = 0, failed = 0;
for (const line of lines) {
  if (!line || line.startsWith("#")) continue;
  const [minor, currency, ...want] = line.split(" ");
  const got = money(Number(minor), currency);
  cases++;
  if (got !== want.join(" ")) {
    failed++;
    console.log(`FAIL  money(${minor}, ${currency}): got ${JSON.stringify(got)}, want ${JSON.stringify(want.join(" "))}`);
  }
}
if (money(null, "EUR") !== "EUR" || money(1500) !== "15.00") {
  failed++;
  console.log("FAIL  money without an amount or a currency");
}
console.log(`${cases} cases, ${failed} failed`);
process.exit(failed || cases < 10 ? 1 : 0);
