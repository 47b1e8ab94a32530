// The console's page. Everything shown is built with DOM nodes and
// textContent, never innerHTML: whatever a dead letter or the provider
// says renders as text. The session cookie is HttpOnly; the CSRF token
// lives in this script's memory and goes with every POST.
"use strict";

const API = "/console/api/";
const state = { who: null, csrf: null };

// el("td", {class: "x"}, "text", otherNode): children that are not nodes
// become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
function pretty(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); }
// "2026-12-01T10:00:00.000Z" -> "2026-12-01 10:00:00" (UTC), for tables.
function when(t) { return t ? String(t).replace("T", " ").replace(/\.\d+Z$/, "") : "-"; }
// A UUID's first block, the whole one on hover.
function shortId(id) { return id ? el("span", { class: "mono", title: id }, String(id).slice(0, 8) + "…") : "-"; }
function pill(text) { return el("span", { class: "pill " + String(text) }, text); }
function notice(kind, text) { return el("div", { class: "notice " + kind, role: "status" }, text); }
function isOperator() { return state.who && state.who.role === "operator"; }

function age(ms) {
  if (ms === null || ms === undefined) return "-";
  const s = Math.floor(ms / 1000);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.floor(s / 60) + " min";
  if (s < 172800) return Math.floor(s / 3600) + " h";
  return Math.floor(s / 86400) + " d";
}

async function call(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (method === "POST") {
    opts.headers["Content-Type"] = "application/json";
    if (state.csrf) opts.headers["X-CSRF-Token"] = state.csrf;
    opts.body = JSON.stringify(body || {});
  }
  const res = await fetch(API + path, opts);
  let data = null;
  try { data = await res.json(); } catch (e) { data = { error: "no JSON answer (" + res.status + ")" }; }
  if (res.status === 401 && path !== "login") { signedOut(data && data.error); }
  return { status: res.status, data };
}

// ---- sign-in ----

function signedOut(why) {
  state.who = null;
  state.csrf = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  document.getElementById("page").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = why || "";
}

function signedIn(who) {
  state.who = who;
  state.csrf = who.csrf_token;
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  const w = clear(document.getElementById("who"));
  w.hidden = false;
  w.appendChild(el("span", { "data-testid": "who" }, who.name + " (" + who.role + ")"));
  w.appendChild(el("button", { type: "button", onclick: signOut }, "Sign out"));
  document.getElementById("page").hidden = false;
  route();
}

async function signOut() {
  await call("POST", "logout", {});
  signedOut("Signed out.");
}

async function signIn(ev) {
  ev.preventDefault();
  const input = document.getElementById("token");
  const r = await call("POST", "login", { token: input.value.trim() });
  input.value = "";
  if (r.status === 200) signedIn(r.data);
  else document.getElementById("login-error").textContent = r.data.error || "refused";
}

// ---- pages ----

const pages = { overview: showOverview, reviews: showReviews, letters: showLetters, attempt: showAttempt,
  limits: showLimits };

// "#/attempt/<id>" -> ["attempt", "<id>"]; a link that does not decode, or
// names no page of ours (say "__proto__"), shows the overview and says so.
function route() {
  if (!state.who) return;
  let parts = null;
  try {
    parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  } catch (e) {
    parts = null;
  }
  const known = parts && Object.prototype.hasOwnProperty.call(pages, parts[0]);
  const name = known ? parts[0] : "overview";
  for (const a of document.querySelectorAll("nav a"))
    a.classList.toggle("active", a.dataset.page === name);
  const page = clear(document.getElementById("page"));
  if (!known && location.hash.replace(/^#\/?/, ""))
    page.appendChild(notice("error", "That link names no page of the console; here is the overview."));
  pages[name](page, known ? parts.slice(1) : []);
}

function table(headers, rows, onRow) {
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr", { class: onRow ? "clickable" : null }, r.cells.map((c) => el("td", {}, c)));
    if (onRow) tr.addEventListener("click", () => onRow(r, tr));
    if (r.testid) tr.setAttribute("data-testid", r.testid);
    body.appendChild(tr);
  }
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), body);
}

function partError(part) {
  return part && part.error ? el("p", { class: "error" }, "unavailable: " + part.error) : null;
}

async function showOverview(page) {
  page.appendChild(el("h1", {}, "Overview"));
  const r = await call("GET", "overview");
  if (r.status !== 200) return page.appendChild(notice("error", r.data.error));
  const o = r.data;
  const grid = el("div", { class: "grid", "data-testid": "overview" });

  const byStatus = o.attempts && o.attempts.attempts_by_status;
  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Attempts by status"), partError(o.attempts),
    byStatus ? table(["Status", "Attempts"], Object.entries(byStatus).map(([k, v]) => ({ cells: [pill(k), v] }))) : null));

  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Oldest UNKNOWN"), partError(o.unknown),
    o.unknown && !o.unknown.error ? [el("div", { class: "big", "data-testid": "oldest-unknown" },
      o.unknown.count ? age(o.unknown.oldest_age_ms) : "none"),
    el("p", { class: "muted" }, o.unknown.count + " attempt(s) UNKNOWN; the reconciler settles them on the provider's evidence")] : null));

  const dl = o.dead_letters;
  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Dead letters by reason"), partError(dl),
    dl && !dl.error ? [el("div", { class: "big" }, dl.total),
      table(["Reason", "Letters"], Object.entries(dl.by_reason).map(([k, v]) => ({ cells: [el("a", { href: "#/letters/" + encodeURIComponent(k) }, k), v] })))] : null));

  const br = o.breakers || [];
  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Provider breaker"),
    br.length ? table(["Worker", "State"], br.map((b) => ({ cells: [b.url, [pill(b.state), b.error ? " " + b.error : ""]] })))
      : el("p", { class: "muted" }, "No worker metrics configured (CONSOLE_WORKER_METRICS).")));

  const lag = o.consumer_lag;
  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Consumer lag"), partError(lag),
    lag && !lag.error ? [el("div", { class: "big", "data-testid": "lag-total" }, lag.total),
      el("p", { class: "muted" }, "group " + lag.group + " on " + lag.topic),
      table(["Partition", "Committed", "End", "Lag"], (lag.partitions || []).map((p) => ({ cells: [p.partition, p.committed, p.end, p.lag] })))] : null));

  const af = o.audit_findings;
  grid.appendChild(el("div", { class: "card" }, el("h2", {}, "Auditor findings"), partError(af),
    af && !af.error ? [el("div", { class: "big" }, af.total),
      table(["Kind", "Findings"], Object.entries(af.by_kind).map(([k, v]) => ({ cells: [k, v] })))] : null));
  page.appendChild(grid);
}

// ---- review queue ----

async function showReviews(page) {
  page.appendChild(el("h1", {}, "Review queue"));
  const r = await call("GET", "reviews");
  if (r.status !== 200) return page.appendChild(notice("error", r.data.error));
  const rows = r.data.reviews, steps = r.data.steps || [], view = r.data.step_view;
  if (!rows.length && !steps.length) return page.appendChild(el("div", { class: "card" }, el("p", { class: "muted", "data-testid": "reviews-empty" }, "Nothing waits for review.")));
  const detail = el("div", { class: "card", "data-testid": "review-detail" }, el("p", { class: "muted" }, "Pick an attempt to see its evidence."));
  if (steps.length) showSteps(page, steps, view);
  if (!rows.length) return;
  if (steps.length) page.appendChild(el("h2", {}, "Charges"));
  const list = table(["Attempt", "Amount", "Updated", "Why in review"],
    rows.map((a) => ({ a, testid: "review-" + a.payment_attempt_id,
      cells: [el("span", { class: "mono" }, a.payment_attempt_id), money(a.amount, a.currency), when(a.updated_at), a.reason || "-"] })),
    (row, tr) => {
      for (const t of list.querySelectorAll("tr.selected")) t.classList.remove("selected");
      tr.classList.add("selected");
      reviewDetail(clear(detail), row.a);
    });
  page.appendChild(el("div", { class: "split" }, el("div", { class: "card" }, list), detail));
}

function reviewDetail(box, a) {
  box.appendChild(el("h2", {}, "Attempt " + a.payment_attempt_id));
  box.appendChild(el("dl", { class: "kv" },
    el("dt", {}, "order"), el("dd", { class: "mono" }, a.order_id),
    el("dt", {}, "amount"), el("dd", {}, money(a.amount, a.currency)),
    el("dt", {}, "intent recorded"), el("dd", { class: "mono" }, a.provider_payment_id || "none"),
    el("dt", {}, "reason"), el("dd", {}, a.reason || "-")));
  if (a.review) {
    box.appendChild(el("h2", {}, "Evidence of the move to review"));
    box.appendChild(el("p", {}, (a.review.at || "") + " by " + (a.review.cause || "?") + (a.review.actor ? " (" + a.review.actor + ")" : "")));
    box.appendChild(el("pre", { "data-testid": "review-evidence" }, pretty(a.review.evidence)));
  }
  box.appendChild(el("p", {}, el("a", { href: "#/attempt/" + a.payment_attempt_id }, "Open the whole timeline")));
  if (!isOperator()) {
    box.appendChild(el("p", { class: "muted" }, "A viewer cannot resolve reviews."));
    return;
  }
  const intent = el("input", { type: "text", id: "resolve-intent", value: a.provider_payment_id || "", placeholder: "pi_..." });
  const reason = el("input", { type: "text", id: "resolve-reason", placeholder: "how you know" });
  const decision = el("select", { id: "resolve-decision" },
    el("option", { value: "succeeded" }, "SUCCEEDED: the provider charged it"),
    el("option", { value: "failed" }, "FAILED: no money moved"));
  const out = el("div", { "data-testid": "resolve-result" });
  const submit = el("button", { type: "button", "data-testid": "resolve-submit" }, "Ask the provider and resolve");
  const send = async (force, confirm) => {
    submit.disabled = true;
    const body = { decision: decision.value };
    if (decision.value === "succeeded") body.payment_intent_id = intent.value.trim();
    if (reason.value.trim()) body.reason = reason.value.trim();
    if (force) { body.force = true; body.confirm = confirm; }
    const r = await call("POST", "attempts/" + a.payment_attempt_id + "/resolve", body);
    submit.disabled = false;
    clear(out);
    if (r.status === 200) {
      out.appendChild(notice("okay", "Resolved " + r.data.status + (r.data.forced ? " over the provider's objection" : "; the provider agrees") + "."));
      submit.disabled = true;
      return;
    }
    out.appendChild(notice("error", (r.status === 409 ? "Conflict: " : "") + (r.data.error || r.data.message || "refused")));
    if (r.status === 422 && r.data.can_force) forceBox(out, a, send);
  };
  submit.addEventListener("click", () => send(false));
  box.appendChild(el("h2", {}, "Resolve"));
  box.appendChild(el("label", { for: "resolve-decision" }, "Decision"));
  box.appendChild(decision);
  box.appendChild(el("label", { for: "resolve-intent" }, "Payment intent (for SUCCEEDED)"));
  box.appendChild(intent);
  box.appendChild(el("label", { for: "resolve-reason" }, "Reason (required for FAILED)"));
  box.appendChild(reason);
  box.appendChild(el("div", { class: "row" }, submit));
  box.appendChild(out);
}

// The operations' records in review (issue 37): each resolved by its kind's
// decisions, the provider asked first, as an attempt's. The kinds, their
// decisions and words are the server's (view: the operations table's).
function showSteps(page, steps, view) {
  const detail = el("div", { class: "card", "data-testid": "step-detail" }, el("p", { class: "muted" }, "Pick one to resolve it."));
  const holder = view.holder[0].toUpperCase() + view.holder.slice(1);
  const list = table(["Kind", "Id", holder, "Amount", "Updated", "Why in review"],
    steps.map((st) => ({ st, testid: "step-" + st.id,
      cells: [st.kind, el("span", { class: "mono" }, st.id), st[view.kinds[st.kind].holder_status] || "-", money(st.amount, st.currency), when(st.updated_at), st.reason || "-"] })),
    (row, tr) => {
      for (const t of list.querySelectorAll("tr.selected")) t.classList.remove("selected");
      tr.classList.add("selected");
      stepDetail(clear(detail), row.st, view.kinds[row.st.kind]);
    });
  page.appendChild(el("h2", {}, view.heading));
  page.appendChild(el("div", { class: "split" }, el("div", { class: "card" }, list), detail));
}

function stepDetail(box, st, kind) {
  box.appendChild(el("h2", {}, st.kind + " " + st.id));
  box.appendChild(el("dl", { class: "kv" },
    el("dt", {}, kind.holder), el("dd", { class: "mono" }, st.payment_attempt_id),
    el("dt", {}, "its status"), el("dd", {}, st[kind.holder_status] || "-"),
    el("dt", {}, "intent recorded"), el("dd", { class: "mono" }, st.provider_payment_id || "none"),
    el("dt", {}, "amount"), el("dd", {}, money(st.amount, st.currency)),
    el("dt", {}, "reason"), el("dd", {}, st.reason || "-")));
  box.appendChild(el("p", {}, el("a", { href: "#/attempt/" + st.payment_attempt_id }, "Open the " + kind.holder + "'s timeline")));
  if (!isOperator()) {
    box.appendChild(el("p", { class: "muted" }, "A viewer cannot resolve reviews."));
    return;
  }
  const decision = el("select", { id: "step-decision" }, ...kind.decisions.map(([v, t]) => el("option", { value: v }, t)));
  const reason = el("input", { type: "text", id: "step-reason", placeholder: "how you know (required)" });
  const out = el("div", { "data-testid": "step-result" });
  const submit = el("button", { type: "button", "data-testid": "step-submit" }, "Ask the provider and resolve");
  const send = async (force, confirm) => {
    submit.disabled = true;
    const body = { decision: decision.value, reason: reason.value.trim() };
    if (force) { body.force = true; body.confirm = confirm; }
    const r = await call("POST", "steps/" + st.kind + "/" + st.id + "/resolve", body);
    submit.disabled = false;
    clear(out);
    if (r.status === 200) {
      out.appendChild(notice("okay", "Resolved " + r.data.status + (r.data.forced ? " over the provider's objection" : "; the provider agrees") + "."));
      submit.disabled = true;
      return;
    }
    out.appendChild(notice("error", (r.status === 409 ? "Conflict: " : "") + (r.data.error || r.data.message || "refused")));
    if (r.status === 422 && r.data.can_force) forceBox(out, { payment_attempt_id: st.id }, send, st.kind + " id");
  };
  submit.addEventListener("click", () => send(false));
  box.appendChild(el("h2", {}, "Resolve"));
  box.appendChild(el("label", { for: "step-decision" }, "Decision"));
  box.appendChild(decision);
  box.appendChild(el("label", { for: "step-reason" }, "Reason"));
  box.appendChild(reason);
  box.appendChild(el("div", { class: "row" }, submit));
  box.appendChild(out);
}

function forceBox(out, a, send, noun = "attempt id") {
  const confirm = el("input", { type: "text", id: "force-confirm", placeholder: a.payment_attempt_id });
  const go = el("button", { type: "button", class: "danger", "data-testid": "force-submit" }, "Resolve anyway");
  go.addEventListener("click", () => send(true, confirm.value.trim()));
  out.appendChild(el("p", {}, "The provider's evidence does not support this decision. To override it, type the " + noun + " and resolve anyway; the evidence records that you did."));
  out.appendChild(el("label", { for: "force-confirm" }, noun[0].toUpperCase() + noun.slice(1)));
  out.appendChild(confirm);
  out.appendChild(el("div", { class: "row" }, go));
}

// ---- dead letters ----

async function showLetters(page, args) {
  page.appendChild(el("h1", {}, "Dead letters"));
  const f = {};
  const field = (name, label, node) => { f[name] = node; return el("div", {}, el("label", { for: "f-" + name }, label), node); };
  // The reason codes come with the first answer (the server's list).
  const reason = el("select", { id: "f-reason" }, el("option", { value: "" }, "any"));
  if (args[0]) reason.appendChild(el("option", { value: args[0], selected: true }, args[0]));
  const form = el("form", { class: "filters card", "data-testid": "letter-filters" },
    field("reason", "Reason", reason),
    field("attempt", "Attempt id", el("input", { type: "text", id: "f-attempt" })),
    field("order", "Order id", el("input", { type: "text", id: "f-order" })),
    field("since", "Since", el("input", { type: "text", id: "f-since", placeholder: "2h or RFC 3339" })),
    field("until", "Until", el("input", { type: "text", id: "f-until" })),
    field("limit", "Newest", el("input", { type: "text", id: "f-limit", value: "100" })),
    el("div", {}, el("button", { type: "submit" }, "Filter")));
  const results = el("div");
  form.addEventListener("submit", (ev) => { ev.preventDefault(); loadLetters(results, f); });
  page.appendChild(form);
  page.appendChild(results);
  loadLetters(results, f);
}

async function loadLetters(box, f) {
  const q = new URLSearchParams();
  for (const k of ["reason", "attempt", "order", "since", "until", "limit"]) {
    const v = f[k].value.trim();
    if (v) q.set(k, v);
  }
  const r = await call("GET", "dead-letters?" + q.toString());
  clear(box);
  if (r.status !== 200) return box.appendChild(notice("error", r.data.error));
  const chosen = f.reason.value;
  if (f.reason.options.length <= 2 && r.data.reasons) {
    clear(f.reason).appendChild(el("option", { value: "" }, "any"));
    for (const code of r.data.reasons) f.reason.appendChild(el("option", { value: code }, code));
    f.reason.value = chosen;
  }
  const letters = r.data.letters;
  const detail = el("div", { class: "card", "data-testid": "letter-detail" }, el("p", { class: "muted" }, "Pick a letter to see it whole."));
  const checks = [];
  const all = el("input", { type: "checkbox", "aria-label": "select all", "data-testid": "select-all" });
  const preview = el("button", { type: "button", "data-testid": "preview-replay", disabled: true }, "Preview replay");
  const count = () => checks.filter((c) => c.checked).length;
  const update = () => { preview.disabled = !isOperator() || count() === 0; preview.textContent = "Preview replay of " + count(); };
  all.addEventListener("change", () => { for (const c of checks) c.checked = all.checked; update(); });
  const body = el("tbody");
  for (const l of letters) {
    const c = el("input", { type: "checkbox", "aria-label": "select " + l.position, "data-position": l.position });
    c.addEventListener("change", update);
    c.addEventListener("click", (ev) => ev.stopPropagation());
    checks.push(c);
    const tr = el("tr", { class: "clickable", "data-testid": "letter-" + l.position },
      el("td", {}, c), el("td", { class: "mono nowrap" }, l.position), el("td", { class: "nowrap" }, when(l.failed_at)),
      el("td", {}, l.reason || "-"), el("td", {}, shortId(l.payment_attempt_id)), el("td", {}, l.error || "-"));
    tr.addEventListener("click", () => {
      for (const t of body.querySelectorAll("tr.selected")) t.classList.remove("selected");
      tr.classList.add("selected");
      letterDetail(clear(detail), l.position);
    });
    body.appendChild(tr);
  }
  const list = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, all), ["Position", "Failed at", "Reason", "Attempt", "Error"].map((h) => el("th", {}, h)))), body);
  const panel = el("div", { "data-testid": "replay-panel" });
  preview.addEventListener("click", () => replayPreview(panel, checks.filter((c) => c.checked).map((c) => c.dataset.position)));
  update();
  box.appendChild(el("div", { class: "split" },
    el("div", { class: "card" }, el("p", { class: "muted" }, letters.length + " shown of " + r.data.read + " read"),
      list, el("div", { class: "row" }, preview, isOperator() ? null : el("span", { class: "muted" }, "A viewer cannot replay.")), panel),
    detail));
}

async function letterDetail(box, position) {
  const r = await call("GET", "dead-letters/" + position);
  if (r.status !== 200) return box.appendChild(notice("error", r.data.error));
  const l = r.data;
  box.appendChild(el("h2", {}, "Letter " + l.position));
  box.appendChild(el("dl", { class: "kv" },
    el("dt", {}, "reason"), el("dd", {}, l.reason || "-"),
    el("dt", {}, "error"), el("dd", { "data-testid": "letter-error" }, l.error || "-"),
    el("dt", {}, "failed at"), el("dd", {}, l.failed_at || "-"),
    el("dt", {}, "from"), el("dd", { class: "mono" }, l.original ? (l.original.topic || "?") + " [" + (l.original.partition || "?") + "] @" + (l.original.offset || "?") : "-"),
    el("dt", {}, "replayable"), el("dd", {}, l.replayable ? "yes" : "no")));
  box.appendChild(el("h2", {}, "Headers"));
  box.appendChild(table(["Name", "Value"], (l.headers || []).map((h) => ({ cells: [el("span", { class: "mono" }, h[0]), el("span", { class: "mono" }, pretty(h[1]))] }))));
  box.appendChild(el("h2", {}, "Key"));
  box.appendChild(el("pre", { "data-testid": "letter-key" }, l.key === null ? "(none)" : pretty(l.key)));
  box.appendChild(el("h2", {}, "Value"));
  box.appendChild(el("pre", { "data-testid": "letter-value" }, l.value === null ? "(none)" : pretty(l.value)));
}

async function replayPreview(panel, positions) {
  clear(panel);
  const r = await call("POST", "dead-letters/replay", { positions, dry_run: true });
  if (r.status !== 200) return panel.appendChild(notice("error", r.data.error));
  const letters = r.data.letters;
  const sendable = letters.filter((l) => !l.skipped).length;
  panel.appendChild(el("h2", {}, "Preview: nothing is sent yet"));
  for (const l of letters) {
    if (l.skipped) {
      panel.appendChild(notice("error", l.position + " will be skipped: " + l.why_skipped));
      continue;
    }
    panel.appendChild(el("div", { class: "card", "data-testid": "preview-" + l.position },
      el("p", {}, el("strong", {}, l.position), " would be sent to ", el("span", { class: "mono" }, l.message.topic)),
      el("pre", {}, pretty(l.message))));
  }
  const send = el("button", { type: "button", class: "danger", "data-testid": "replay-submit", disabled: sendable === 0 }, "Replay " + sendable + " letter(s)");
  send.addEventListener("click", async () => {
    send.disabled = true;
    const s = await call("POST", "dead-letters/replay", { positions, dry_run: false });
    clear(panel);
    if (!s.data.letters) return panel.appendChild(notice("error", s.data.error));
    for (const l of s.data.letters)
      panel.appendChild(notice(l.sent ? "okay" : "error", l.position + ": " +
        (l.skipped ? "skipped" : l.sent ? "sent to [" + l.sent_partition + "] at offset " + l.sent_offset : "not sent: " + (l.send_error || s.data.error))));
  });
  panel.appendChild(el("div", { class: "row" }, send));
}

// ---- attempt timeline ----

async function showAttempt(page, args) {
  page.appendChild(el("h1", {}, "Attempt"));
  const input = el("input", { type: "text", id: "find-id", placeholder: "attempt id, order id or pi_..." });
  const form = el("form", { class: "card row" }, el("label", { for: "find-id" }, "Find by attempt, order or intent id"), input, el("button", { type: "submit" }, "Find"));
  const out = el("div");
  form.addEventListener("submit", (ev) => { ev.preventDefault(); location.hash = "#/attempt/" + encodeURIComponent(input.value.trim()); });
  page.appendChild(form);
  page.appendChild(out);
  if (!args[0]) return;
  input.value = args[0];
  const f = await call("GET", "attempts?id=" + encodeURIComponent(args[0]));
  if (f.status !== 200) return out.appendChild(notice("error", f.data.error));
  const found = f.data.attempts;
  if (found.length === 0) return out.appendChild(notice("error", "No attempt has that id, order or intent."));
  if (found.length > 1) {
    out.appendChild(el("div", { class: "card" }, el("h2", {}, found.length + " attempts"),
      table(["Attempt", "Status", "Amount", "Updated"], found.map((a) => ({ a, cells: [el("span", { class: "mono" }, a.payment_attempt_id), pill(a.status), money(a.amount, a.currency), a.updated_at] })),
        (row) => { location.hash = "#/attempt/" + row.a.payment_attempt_id; })));
    return;
  }
  const r = await call("GET", "attempts/" + found[0].payment_attempt_id);
  if (r.status !== 200) return out.appendChild(notice("error", r.data.error));
  timeline(out, r.data);
}

function timeline(out, h) {
  const a = h.attempt;
  out.appendChild(el("div", { class: "card", "data-testid": "attempt-summary" },
    el("h2", {}, "Attempt ", el("span", { class: "mono" }, a.payment_attempt_id), " ", pill(a.status)),
    el("dl", { class: "kv" },
      el("dt", {}, "order"), el("dd", { class: "mono" }, a.order_id),
      el("dt", {}, "amount"), el("dd", {}, money(a.amount, a.currency)),
      el("dt", {}, "idempotency key"), el("dd", { class: "mono" }, a.idempotency_key),
      el("dt", {}, "provider intent"), el("dd", { class: "mono" }, a.provider_payment_id || "-"),
      el("dt", {}, "refunded"), el("dd", {}, money(a.refunded_amount || 0, a.currency)),
      a.capture_method === "manual" ? [el("dt", {}, h.steps_view.taken.toLowerCase()), el("dd", {}, a.captured_amount === null ? "-" : money(a.captured_amount, a.currency))] : null,
      el("dt", {}, "reason"), el("dd", {}, a.reason || "-"),
      // Held back before its call: queued, not failed (docs/states.md).
      a.waiting_reason ? [el("dt", {}, "queued"), el("dd", { "data-testid": "attempt-queued" }, a.waiting_reason + " since " + a.waiting_since)] : null,
      el("dt", {}, "created"), el("dd", {}, a.created_at))));
  const items = [];
  for (const t of h.transitions || [])
    items.push({ at: t.at, kind: "transition", title: (t.old_status || "new") + " → " + t.new_status,
      text: [t.cause, t.actor ? "by " + t.actor : "", t.reason || ""].filter(Boolean).join(" · "), detail: t.evidence });
  for (const c of h.provider_calls || [])
    items.push({ at: c.started_at, kind: "provider call", title: c.operation + ": " + c.outcome,
      text: [c.http_status ? "HTTP " + c.http_status : "", c.provider_payment_id || "", c.latency_ms !== null ? c.latency_ms + " ms" : "", c.error || ""].filter(Boolean).join(" · ") });
  for (const l of h.ledger_entries || [])
    items.push({ at: l.created_at, kind: "ledger", title: l.kind + " " + money(l.amount, l.currency), text: l.provider_payment_id || "" });
  for (const e of h.result_events || [])
    items.push({ at: e.created_at, kind: "result event", title: e.event_type, text: e.published_at ? "published " + e.published_at : "not published yet", detail: e.payload });
  for (const r of h.refunds || [])
    items.push({ at: r.updated_at, kind: "refund", title: r.status + " " + money(r.amount, r.currency), text: [r.refund_id, r.refund_reason, r.reason].filter(Boolean).join(" · ") });
  const steps = stepsOf(h, a);
  for (const st of steps)
    for (const t of st.transitions || [])
      items.push({ at: t.at, kind: st.kind, title: st.id.slice(0, 8) + ": " + (t.old_status || "new") + " → " + t.new_status,
        text: [t.cause, t.actor ? "by " + t.actor : "", t.reason || ""].filter(Boolean).join(" · "), detail: t.evidence });
  // In time order; within one instant the attempt's move first (a step
  // succeeds only once its authorization moved), as chargectl shows it.
  const rank = { transition: 0 };
  items.sort((x, y) => (x.at || "").localeCompare(y.at || "") || (rank[x.kind] ?? 1) - (rank[y.kind] ?? 1));
  const list = el("ol", { class: "timeline", "data-testid": "timeline" });
  for (const i of items)
    list.appendChild(el("li", { "data-kind": i.kind },
      el("div", { class: "when" }, i.at || "-"),
      el("div", {}, el("span", { class: "kind" }, i.kind), i.title),
      i.text ? el("div", { class: "muted" }, i.text) : null,
      i.detail && Object.keys(i.detail).length ? el("details", {}, el("summary", {}, "evidence"), el("pre", {}, pretty(i.detail))) : null));
  if (steps.length)
    out.appendChild(el("div", { class: "card", "data-testid": "steps" }, el("h2", {}, h.steps_view.heading),
      table(["Step", "Id", "Status", "Amount", h.steps_view.taken, "Reason", "Updated"], steps.map((st) => ({
        testid: "step-" + st.id,
        cells: [st.kind, el("span", { class: "mono" }, st.id), pill(st.status), st.amount, st.taken, st.reason || "-", when(st.updated_at)],
      })))));
  out.appendChild(el("div", { class: "card" }, el("h2", {}, "Timeline"), list));
}

// An attempt's steps of every operation (the server's one list), oldest
// first: each with its id, status, what it asked, what it took (an amount,
// or the server's word for none), why, and its transitions.
function stepsOf(h, a) {
  const shown = (v) => (typeof v === "number" ? money(v, a.currency) : v);
  return (h.steps || []).map((st) => ({ ...st, amount: shown(st.amount), taken: shown(st.taken) }))
    .sort((x, y) => (x.created_at || "").localeCompare(y.created_at || ""));
}

// ---- the provider budget (issue 38) ----

// requests/s as set: 0 is no limit.
function rps(n) { return n ? n + "/s" : "no limit"; }
// A share in milli-requests/s: -1 is no limit.
function share(m) { return m === null || m === undefined || m < 0 ? "-" : (m / 1000).toFixed(3); }

async function showLimits(page) {
  page.appendChild(el("h1", {}, "Provider limits"));
  const r = await call("GET", "provider-limits");
  if (r.status !== 200) return page.appendChild(notice("error", r.data.error));
  const b = r.data, classes = b.class_names;
  page.appendChild(el("div", { class: "card", "data-testid": "limits" }, el("h2", {}, "Settings (account " + b.account + ")"),
    table(["Limit", "Requests/s"], [{ cells: ["global", rps(b.global_rps)], testid: "limit-global" }]
      .concat(classes.map((c) => ({ cells: [c, rps(b.classes[c])], testid: "limit-" + c })))
      .concat([{ cells: ["audit floor", b.audit_floor_rps + "/s"], testid: "limit-audit-floor" }])),
    el("p", { class: "muted", "data-testid": "limits-version" }, "version " + b.version + ", set by " + b.updated_by + " at " + when(b.updated_at))));
  const members = b.members || [];
  page.appendChild(el("div", { class: "card", "data-testid": "members" }, el("h2", {}, "Members and their shares (requests/s; - is no limit)"),
    members.length ? table(["Role", "Pid", "Host", "Global"].concat(classes, ["Floor", "Lease left"]),
      members.map((m) => ({ testid: "member-" + m.member_id,
        cells: [m.role, m.pid, m.host].concat((m.held_mrps || []).map(share), [m.expires_in_ms + " ms"]) })))
      : el("p", { class: "muted" }, "No live member: no process of the fleet draws on the budget now.")));
  if (!isOperator()) return page.appendChild(el("p", { class: "muted" }, "A viewer cannot change the limits."));
  limitsForm(page, b);
}

function limitsForm(page, b) {
  const classes = b.class_names;
  const fields = [["global", b.global_rps]].concat(classes.map((c) => [c, b.classes[c]]), [["audit_floor", b.audit_floor_rps]]);
  const inputs = {};
  const form = el("div", { class: "card" }, el("h2", {}, "Set the limits"),
    el("p", { class: "muted" }, "Whole requests/s, 0 for no limit. Recorded with you as the actor; the fleet follows within about a second."));
  for (const [name, value] of fields) {
    inputs[name] = el("input", { type: "number", min: 0, step: 1, id: "limit-input-" + name, value });
    form.appendChild(el("label", { for: "limit-input-" + name }, name.replace("_", " ")));
    form.appendChild(inputs[name]);
  }
  const out = el("div", { "data-testid": "limits-result" });
  const submit = el("button", { type: "button", "data-testid": "limits-submit" }, "Set");
  submit.addEventListener("click", async () => {
    const body = { classes: {} };
    for (const [name, value] of fields) {
      const v = Number(inputs[name].value);
      if (v === value) continue;
      if (classes.includes(name)) body.classes[name] = v;
      else body[name] = v;
    }
    if (!Object.keys(body.classes).length) delete body.classes;
    clear(out);
    if (!Object.keys(body).length) return out.appendChild(notice("error", "Nothing changed."));
    submit.disabled = true;
    const r = await call("POST", "provider-limits/set", body);
    submit.disabled = false;
    if (r.status !== 200) return out.appendChild(notice("error", r.data.error || "refused"));
    // The page again, with what is now in force, and what was done on top.
    await showLimits(clear(page));
    page.insertBefore(el("div", { "data-testid": "limits-set" }, notice("okay", "Set by " + r.data.updated_by +
      ": version " + r.data.version + ". The fleet follows within about a second.")), page.children[1] || null);
  });
  form.appendChild(el("div", { class: "row" }, submit));
  form.appendChild(out);
  page.appendChild(form);
}

// ---- start ----

document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("login-form").addEventListener("submit", signIn);
  window.addEventListener("hashchange", route);
  const r = await call("GET", "session");
  if (r.status === 200) signedIn(r.data);
  else signedOut("");
});
