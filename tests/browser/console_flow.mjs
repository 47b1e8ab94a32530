// One operator's walk through the console in Debian's chromium, driven by
// playwright-core: sign in, the overview, a review resolved (the provider
// holds the intent succeeded, but it only names the attempt: refused, then
// forced on the operator's word), a hostile dead letter read, a dead letter previewed and
// replayed, an attempt's timeline, the provider's limits set. A screenshot of each page goes to
// CONSOLE_FLOW's "shots" folder. Run by tests/e2e/test_console_browser.py,
// which sets the scene and checks the database afterwards; CONSOLE_FLOW is
// {base, token, review: {attempt, intent, order, money}, hostile, replay, shots,
// steps: {attempt, capture, void, captured, void_reason}, limits: {global, actor}}.
// Prints one JSON line of what it saw; exits 1 on the first failed check.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const cfg = JSON.parse(process.env.CONSOLE_FLOW);
const WAIT = { timeout: Number(process.env.CONSOLE_FLOW_TIMEOUT_MS || 30000) };
const saw = { pages: [] };

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}

async function shot(page, name) {
  const path = join(cfg.shots, name + ".png");
  await page.screenshot({ path, fullPage: true });
  saw.pages.push(name);
}

const profile = mkdtempSync(join(tmpdir(), "charged-console-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1440, height: 900 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = null;
try {
  const page = context.pages()[0] || await context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  // A 401 is the page asking whether it is signed in, or a refused token;
  // two 422s are the provider's objections to the review's and the void's
  // first decisions: expected. Anything else the browser calls an error is
  // a problem.
  let objections = 0;
  page.on("console", (m) => {
    if (m.type() !== "error" || /status of 401/.test(m.text())) return;
    if (/status of 422/.test(m.text()) && objections++ < 2) return;
    problems.push("console: " + m.text());
  });
  page.on("dialog", (d) => { problems.push("a dialog opened: " + d.message()); d.dismiss(); });

  // ---- sign in ----
  await page.goto(cfg.base + "/console/");
  await page.locator("#login-form").waitFor(WAIT);
  await shot(page, "login");
  await page.fill("#token", "cct_" + "x".repeat(43));
  await page.click("#login-form button");
  await page.locator("#login-error", { hasText: "unknown or revoked token" }).waitFor(WAIT);
  await page.fill("#token", cfg.token);
  await page.click("#login-form button");
  await page.locator("[data-testid=who]", { hasText: "(operator)" }).waitFor(WAIT);
  const cookies = await context.cookies(cfg.base + "/console/");
  const session = cookies.find((c) => c.name === "charged_console");
  check(session && session.httpOnly && session.sameSite === "Strict", "the session cookie: " + JSON.stringify(session));
  check(await page.evaluate(() => document.cookie) === "", "a script can read the session cookie");

  // ---- overview ----
  await page.locator("[data-testid=overview]").waitFor(WAIT);
  await page.locator("[data-testid=overview] .pill", { hasText: "REQUIRES_REVIEW" }).first().waitFor(WAIT);
  await page.locator("[data-testid=lag-total]").waitFor(WAIT);
  await shot(page, "overview");

  // ---- resolve a review ----
  await page.click("nav a[data-page=reviews]");
  await page.locator(`[data-testid="review-${cfg.review.attempt}"]`).click(WAIT);
  await page.locator("[data-testid=review-evidence]").waitFor(WAIT);
  await page.selectOption("#resolve-decision", "succeeded");
  await page.fill("#resolve-intent", cfg.review.intent);
  await page.fill("#resolve-reason", "confirmed with the provider");
  await page.click("[data-testid=resolve-submit]");
  // Not proven the attempt's (its own call under its key was refused):
  // refused, and only the operator's confirmed word books it.
  await page.locator("[data-testid=resolve-result]", { hasText: "is not proven this attempt's" }).waitFor(WAIT);
  await page.fill("#force-confirm", cfg.review.attempt);
  await page.click("[data-testid=force-submit]");
  await page.locator("[data-testid=resolve-result]", { hasText: "Resolved SUCCEEDED over the provider's objection" }).waitFor(WAIT);
  await shot(page, "review");

  // ---- a void in review (issue 37): the provider asked first ----
  await page.locator(`[data-testid="step-${cfg.step_review.void}"]`).click(WAIT);
  await page.selectOption("#step-decision", "succeeded");
  await page.fill("#step-reason", "released per the dashboard");
  await page.click("[data-testid=step-submit]");
  await page.locator("[data-testid=step-result]", { hasText: "requires_capture" }).waitFor(WAIT);
  await page.selectOption("#step-decision", "failed");
  await page.fill("#step-reason", "still held at the provider");
  await page.click("[data-testid=step-submit]");
  await page.locator("[data-testid=step-result]", { hasText: "Resolved FAILED; the provider agrees" }).waitFor(WAIT);
  await shot(page, "step-review");

  // ---- a hostile dead letter, whole ----
  await page.click("nav a[data-page=letters]");
  await page.locator(`[data-testid="letter-${cfg.hostile}"]`).click(WAIT);
  await page.locator("[data-testid=letter-value]").waitFor(WAIT);
  const value = await page.locator("[data-testid=letter-value]").textContent();
  const key = await page.locator("[data-testid=letter-key]").textContent();
  const error = await page.locator("[data-testid=letter-error]").textContent();
  for (const [what, text] of [["value", value], ["key", key], ["error", error]]) {
    check(text.includes("<script>window.__pwned=1</script>"), what + " does not show the markup as text: " + text);
    check(text.includes("onerror="), what + " does not show the img markup as text");
    check(!text.includes(cfg.card), what + " shows the card number");
    check(text.includes("************4242"), what + " does not show the masked number: " + text);
  }
  const inert = await page.evaluate(() => ({
    pwned: window.__pwned === undefined ? null : window.__pwned,
    imgs: document.querySelectorAll("img").length,
    scripts: [...document.querySelectorAll("script")].map((s) => s.getAttribute("src")),
  }));
  check(inert.pwned === null, "the letter's script ran: " + JSON.stringify(inert));
  check(inert.imgs === 0, "the letter made an img element");
  check(JSON.stringify(inert.scripts) === JSON.stringify(["/console/money.js", "/console/app.js"]), "scripts on the page: " + inert.scripts);
  saw.hostile = inert;
  await shot(page, "dead-letter");

  // ---- preview, then replay one ----
  await page.check(`input[data-position="${cfg.replay}"]`);
  await page.click("[data-testid=preview-replay]");
  const preview = page.locator(`[data-testid="preview-${cfg.replay}"]`);
  await preview.waitFor(WAIT);
  const previewText = await preview.textContent();
  check(previewText.includes("dlq.replayed_from") && previewText.includes(cfg.commands_topic),
    "the preview does not show what would be sent: " + previewText);
  await shot(page, "replay-preview");
  await page.click("[data-testid=replay-submit]");
  await page.locator("[data-testid=replay-panel]", { hasText: `${cfg.replay}: sent to` }).waitFor(WAIT);
  await shot(page, "replay-sent");

  // ---- the timeline, found by order id and by intent id ----
  for (const id of [cfg.review.order, cfg.review.intent]) {
    await page.goto(cfg.base + "/console/#/attempt/" + encodeURIComponent(id));
    await page.locator("[data-testid=timeline]").waitFor(WAIT);
    await page.locator("[data-testid=attempt-summary]", { hasText: cfg.review.attempt }).waitFor(WAIT);
  }
  await page.locator("[data-testid=attempt-summary]", { hasText: cfg.review.money }).waitFor(WAIT);
  const timeline = page.locator("[data-testid=timeline]");
  await timeline.locator("li", { hasText: "REQUIRES_REVIEW → SUCCEEDED" }).waitFor(WAIT);
  await timeline.locator("li[data-kind=ledger]").first().waitFor(WAIT);
  await timeline.locator("li[data-kind='provider call']").first().waitFor(WAIT);
  saw.timeline_kinds = await timeline.locator("li").evaluateAll((ls) => ls.map((l) => l.dataset.kind));
  await shot(page, "attempt");

  // ---- an authorization's captures and voids, beside its own moves ----
  if (cfg.steps) {
    await page.goto(cfg.base + "/console/#/attempt/" + encodeURIComponent(cfg.steps.attempt));
    const steps = page.locator("[data-testid=steps]");
    await steps.waitFor(WAIT);
    await steps.locator(`[data-testid="step-${cfg.steps.capture}"]`, { hasText: "SUCCEEDED" }).waitFor(WAIT);
    await steps.locator(`[data-testid="step-${cfg.steps.capture}"]`, { hasText: cfg.steps.captured }).waitFor(WAIT);
    await steps.locator(`[data-testid="step-${cfg.steps.void}"]`, { hasText: "REJECTED" }).waitFor(WAIT);
    await steps.locator(`[data-testid="step-${cfg.steps.void}"]`, { hasText: cfg.steps.void_reason }).waitFor(WAIT);
    await page.locator("[data-testid=attempt-summary]", { hasText: cfg.steps.captured }).waitFor(WAIT);
    const tl = page.locator("[data-testid=timeline]");
    await tl.locator("li[data-kind=capture]", { hasText: "PROCESSING → SUCCEEDED" }).waitFor(WAIT);
    await tl.locator("li[data-kind=void]", { hasText: "new → REJECTED" }).waitFor(WAIT);
    saw.step_timeline = await tl.locator("li").evaluateAll((ls) =>
      ls.filter((l) => l.dataset.kind === "transition" || l.dataset.kind === "capture" || l.dataset.kind === "void")
        .map((l) => l.dataset.kind + ":" + l.querySelector("div + div").lastChild.textContent.split(": ").pop()));
    await shot(page, "attempt-steps");
  }

  // ---- the provider budget: the global limit set to 100 (issue 38) ----
  if (cfg.limits) {
    await page.goto(cfg.base + "/console/#/limits");
    await page.locator("[data-testid=limit-global]", { hasText: "no limit" }).waitFor(WAIT);
    await page.fill("#limit-input-global", String(cfg.limits.global));
    await page.click("[data-testid=limits-submit]");
    await page.locator("[data-testid=limits-set]", { hasText: "Set by " + cfg.limits.actor }).waitFor(WAIT);
    await page.locator("[data-testid=limit-global]", { hasText: cfg.limits.global + "/s" }).waitFor(WAIT);
    await shot(page, "limits");
  }

  await page.click("#who button");
  await page.locator("#login-error", { hasText: "Signed out." }).waitFor(WAIT);
  check(problems.length === 0, "the page reported problems: " + problems.join("; "));
} catch (e) {
  failed = e;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
if (failed) {
  console.error(failed.stack || String(failed));
  process.exit(1);
}
console.log(JSON.stringify(saw));
