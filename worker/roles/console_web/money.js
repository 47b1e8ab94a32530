// money(minor, currency): an amount in minor units as people read money,
// "15.00 EUR": the digits after the point are the currency's ISO 4217
// minor unit (2 unless the table says otherwise). The same as chargectl's
// (common/core/money.c); tests/unit/money_cases.txt tests both.
"use strict";

const MONEY_EXPONENTS = {
  0: ["BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
      "UYI", "VND", "VUV", "XAF", "XOF", "XPF"],
  3: ["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"],
  4: ["CLF", "UYW"],
};

function moneyExponent(currency) {
  for (const [e, codes] of Object.entries(MONEY_EXPONENTS))
    if (codes.includes(currency)) return Number(e);
  return 2;
}

function money(minor, currency) {
  if (typeof minor !== "number" || !Number.isSafeInteger(minor))
    return [minor, currency].filter((x) => x !== null && x !== undefined).join(" ");
  const e = moneyExponent(currency);
  const digits = String(Math.abs(minor)).padStart(e + 1, "0");
  const whole = digits.slice(0, digits.length - e);
  const text = (minor < 0 ? "-" : "") + whole + (e ? "." + digits.slice(digits.length - e) : "");
  return currency ? text + " " + currency : text;
}

if (typeof module !== "undefined") module.exports = { money, moneyExponent };
