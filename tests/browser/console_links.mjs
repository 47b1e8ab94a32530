// Links into the console that a stranger can send an operator: the page's
// hash router given a malformed escape or a name of Object.prototype. Each
// must show a page (its <h1>), with no page error. CONSOLE_LINKS is
// {base, token, hashes: [...]}. Prints one JSON line {hash: what it saw};
// run by tests/e2e/test_console_adversary.py (links_blank_the_page).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const cfg = JSON.parse(process.env.CONSOLE_LINKS);
const profile = mkdtempSync(join(tmpdir(), "charged-console-links-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const saw = {};
try {
  const page = context.pages()[0] || await context.newPage();
  let errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(cfg.base + "/console/");
  await page.fill("#token", cfg.token);
  await page.click("#login-form button");
  await page.locator("[data-testid=who]").waitFor({ timeout: 30000 });
  for (const h of cfg.hashes) {
    errors = [];
    await page.goto(cfg.base + "/console/" + h);
    await page.waitForTimeout(1500);
    const h1 = await page.locator("#page h1").allTextContents();
    saw[h] = { h1, errors };
  }
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(saw));
