// The /admin page's script (an ES module, no build step): reads and drives
// the host through its API with the key kept in sessionStorage, follows the
// live event and log streams, builds settings forms from each model's
// schema and streams a chat.

const KEY = "hangar-api-key";
const $ = (id) => document.getElementById(id);

/** An element with attributes and children (strings become text, never HTML). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child);
  }
  return node;
}

function headers(extra = {}) {
  const key = sessionStorage.getItem(KEY);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

/** An API error: the server's own message, and its status. */
class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function failure(response) {
  const text = await response.text();
  let message = text;
  try {
    message = JSON.parse(text).error?.message ?? text;
  } catch {
    // Not JSON: the text is the message.
  }
  return new ApiError(response.status, `${response.status}: ${message}`);
}

/** `method path` with a JSON body; the parsed answer, or an ApiError. */
async function api(path, method = "GET", body = undefined) {
  const init = { method, headers: headers() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.json();
}

function status(text, bad = false) {
  const node = $("status");
  node.textContent = text;
  node.className = bad ? "error" : "ok";
}

const bytes = (n) =>
  n === null || n === undefined ? "" : n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;

/**
 * Reads a server-sent-event response, calling `onEvent(name, data)` for
 * each event, until it ends or `signal` aborts. (EventSource cannot send
 * the Authorization header, so this reads the stream through fetch.)
 */
async function follow(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers(), signal });
  if (!response.ok) throw await failure(response);
  await eventsOf(response, onEvent);
}

/** Calls `onEvent(name, data)` for each event of an SSE response until it ends. */
async function eventsOf(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

// ---------------------------------------------------------------- engines

async function showEngines() {
  const report = await api("/api/plugins");
  $("platform").textContent = `on ${report.platform}`;
  $("engines-body").replaceChildren(
    ...report.plugins.map((p) =>
      el(
        "tr",
        { "data-plugin": p.id },
        el("td", {}, p.id),
        el("td", { class: p.status === "ready" ? "ok" : "error" }, p.status),
        el("td", {}, p.formats.join(", ")),
        el("td", {}, p.platforms.join("; ")),
        el("td", {}, p.priority ?? ""),
        el("td", {}, p.engine_version ?? ""),
        el(
          "td",
          {},
          p.capabilities_on.join(", "),
          p.capabilities_off.length ? el("small", {}, ` (off: ${p.capabilities_off.join(", ")})`) : "",
        ),
        // For a ready engine the detail is what the probe found; otherwise, why not.
        el("td", { class: p.status === "ready" ? "" : "why" }, p.detail ?? ""),
      ),
    ),
  );
  $("registry-errors").replaceChildren(...report.registry_errors.map((e) => el("li", {}, e)));
}

// ----------------------------------------------------------------- models

/** The stored settings of each model, as last read. */
const stored = new Map();

async function modelSettings(id) {
  try {
    const view = await api(`/api/models/${encodeURIComponent(id)}/settings`);
    stored.set(id, view.stored);
    return view;
  } catch (e) {
    stored.set(id, {});
    return { error: e.message, stored: {} };
  }
}

/** Replaces a model's stored settings with `change` applied to them. */
async function changeStored(id, change) {
  const next = { ...(stored.get(id) ?? {}) };
  change(next);
  for (const [k, v] of Object.entries(next)) if (v === null || v === "") delete next[k];
  const view = await api(`/api/models/${encodeURIComponent(id)}/settings`, "PUT", next);
  stored.set(id, view.stored);
  return view;
}

async function act(what, run) {
  let result;
  try {
    status(`${what}…`);
    result = await run();
    // A settings change says when it takes effect (stored settings apply
    // from the model's next load).
    status(`${what}: done${result?.applies ? `; applies ${result.applies}` : ""}`);
  } catch (e) {
    status(`${what}: ${e.message}`, true);
  }
  await refresh();
  return result;
}

async function showModels() {
  const [models, sessions] = await Promise.all([api("/api/models"), api("/api/sessions")]);
  const scheduled = new Map(sessions.scheduler.models.map((m) => [m.model, m]));
  const views = await Promise.all(models.models.map((m) => modelSettings(m.model.id)));
  $("models-body").replaceChildren(
    ...models.models.map((m, i) => {
      const id = m.model.id;
      const view = views[i];
      const plan = scheduled.get(id);
      const mine = view.stored ?? {};
      const ttl = el("input", { type: "number", min: "1", value: mine.ttl_seconds ?? "", class: "ttl", size: 6 });
      return el(
        "tr",
        { "data-model": id },
        el("td", {}, id),
        el("td", {}, m.model.format),
        el("td", { class: "state" }, m.session ? m.session.state : m.state),
        el("td", { class: view.error ? "why" : "" }, m.session?.plugin ?? view.plugin ?? view.error),
        el("td", {}, plan ? bytes(plan.held_bytes ?? plan.need_bytes) : ""),
        el(
          "td",
          {},
          el("input", {
            type: "checkbox",
            class: "pin",
            checked: mine.pin === true,
            onchange: (e) =>
              act(`${e.target.checked ? "pin" : "unpin"} ${id}`, () =>
                changeStored(id, (s) => (s.pin = e.target.checked ? true : null)),
              ),
          }),
        ),
        el(
          "td",
          {},
          ttl,
          el(
            "button",
            {
              type: "button",
              onclick: () =>
                act(`TTL of ${id}`, () => changeStored(id, (s) => (s.ttl_seconds = ttl.value ? Number(ttl.value) : null))),
            },
            "set",
          ),
        ),
        el(
          "td",
          {},
          el(
            "button",
            { type: "button", class: "load", onclick: () => act(`load ${id}`, () => api(`/api/models/${encodeURIComponent(id)}/load`, "POST")) },
            "Load",
          ),
          el(
            "button",
            { type: "button", class: "unload", onclick: () => act(`unload ${id}`, () => api(`/api/models/${encodeURIComponent(id)}/unload`, "POST")) },
            "Unload",
          ),
        ),
      );
    }),
  );
  $("not-models").replaceChildren(...models.not_models.map((r) => el("li", {}, `${r.path}: ${r.reason}`)));
  for (const select of [$("settings-model"), $("chat-model")]) {
    const chosen = select.value;
    select.replaceChildren(...models.models.map((m) => el("option", { value: m.model.id }, m.model.id)));
    if (chosen && models.models.some((m) => m.model.id === chosen)) select.value = chosen;
  }
  showSessions(sessions);
}

// --------------------------------------------------------------- sessions

let logs = null;

function showSessions(view) {
  $("sessions-body").replaceChildren(
    ...view.sessions.map((s) =>
      el(
        "tr",
        { "data-session": s.id },
        el("td", {}, s.id),
        el("td", {}, s.model),
        el("td", {}, `${s.plugin} ${s.engine_version ?? ""}`),
        el("td", {}, s.state),
        el("td", {}, s.pid ?? "in host"),
        el("td", {}, s.in_flight),
        el("td", {}, s.requests_served),
        el("td", {}, el("button", { type: "button", class: "logs", onclick: () => followLogs(s.id) }, "Logs")),
      ),
    ),
  );
}

/** Shows session `id`'s log, live, in place of the one shown before. */
function followLogs(id) {
  logs?.abort();
  logs = new AbortController();
  const out = $("logs");
  out.textContent = "";
  $("logs-of").textContent = `of ${id}`;
  follow(
    `/api/sessions/${encodeURIComponent(id)}/logs/stream`,
    (name, data) => {
      const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.append(name === "lagged" ? `(${data} lines missed)\n` : `${JSON.parse(data)}\n`);
      if (atEnd) out.scrollTop = out.scrollHeight;
    },
    logs.signal,
  )
    .then(() => out.append("(the session ended)\n"))
    .catch((e) => e.name !== "AbortError" && out.append(`(log stream: ${e.message})\n`));
}

let events = null;

/** Follows the host's events; each one also refreshes the tables. */
function followEvents() {
  events?.abort();
  events = new AbortController();
  const list = $("events");
  list.replaceChildren();
  follow(
    "/api/events/stream",
    (name, data) => {
      if (name === "lagged") {
        list.prepend(el("li", {}, `(${data} events missed)`));
        return;
      }
      const e = JSON.parse(data);
      const at = new Date(e.at * 1000).toLocaleTimeString();
      list.prepend(el("li", { "data-kind": e.kind }, `${at} ${e.kind} ${e.model}: ${e.message}`));
      while (list.children.length > 300) list.lastChild.remove();
      scheduleRefresh();
    },
    events.signal,
  ).catch((e) => e.name !== "AbortError" && status(`event stream: ${e.message}`, true));
}

let pending = null;
function scheduleRefresh() {
  clearTimeout(pending);
  pending = setTimeout(refresh, 200);
}

// --------------------------------------------------------------- settings

/** One form control for a setting of the schema. */
function control(spec, value) {
  const name = spec.name;
  switch (spec.type) {
    case "boolean":
      return el("select", { name }, el("option", { value: "" }, "(default)"), ...["true", "false"].map((v) => el("option", { value: v, selected: String(value) === v }, v)));
    case "enum":
      return el("select", { name }, el("option", { value: "" }, "(default)"), ...(spec.values ?? []).map((v) => el("option", { value: v, selected: value === v }, v)));
    case "integer":
    case "number":
      return el("input", { name, type: "number", step: spec.type === "integer" ? "1" : "any", value: value ?? "", placeholder: spec.default ?? "" });
    case "object":
    case "list":
      return el("textarea", { name, rows: 2, placeholder: "JSON" }, value === undefined ? "" : JSON.stringify(value));
    default:
      return el("input", { name, type: "text", value: value ?? "", placeholder: spec.default ?? "" });
  }
}

/** The form's value of `spec`, typed, or null when left empty. */
function read(form, spec) {
  const raw = form.elements[spec.name].value.trim();
  if (raw === "") return null;
  switch (spec.type) {
    case "boolean":
      return raw === "true";
    case "integer":
    case "number":
      return Number(raw);
    case "object":
    case "list":
      return JSON.parse(raw);
    default:
      return raw;
  }
}

function settingsResult(text, bad) {
  const node = $("settings-result");
  node.textContent = text;
  node.className = bad ? "error" : "ok";
}

/** Bumped by each showSettings(), so that only the latest one renders. */
let settingsShown = 0;

async function showSettings() {
  const shown = ++settingsShown;
  const id = $("settings-model").value;
  const form = $("settings-form");
  if (!id) {
    form.replaceChildren();
    return;
  }
  let schema;
  try {
    schema = await api(`/api/models/${encodeURIComponent(id)}/settings/schema`);
  } catch (e) {
    $("settings-engine").textContent = e.message;
    form.replaceChildren();
    $("settings-unavailable").replaceChildren();
    return;
  }
  const view = await modelSettings(id);
  if (shown !== settingsShown) return;
  const mine = view.stored ?? {};
  form.dataset.model = id;
  $("settings-engine").textContent = `${schema.plugin} ${schema.engine_version ?? "(version unknown)"}; ${view.applies ?? ""}`;
  form.replaceChildren(
    ...schema.settings.flatMap((spec) => [
      el("label", { for: `setting-${spec.name}` }, spec.name),
      Object.assign(control(spec, mine[spec.name]), { id: `setting-${spec.name}` }),
      el("span", { class: "help" }, spec.description, spec.value !== null && spec.value !== undefined && mine[spec.name] === undefined ? ` (now ${JSON.stringify(spec.value)} from ${spec.source})` : ""),
    ]),
    el("span"),
    el("button", { type: "submit" }, "Save"),
  );
  form.onsubmit = async (event) => {
    event.preventDefault();
    try {
      const values = Object.fromEntries(schema.settings.map((spec) => [spec.name, read(form, spec)]));
      await changeStored(id, (s) => Object.assign(s, values));
      settingsResult(`saved settings of ${id}`, false);
    } catch (e) {
      settingsResult(e.message, true);
    }
    await showSettings();
  };
  $("settings-unavailable").replaceChildren(
    ...schema.unavailable.map((u) => el("li", { "data-setting": u.name }, el("strong", {}, u.name), ` (${u.capability}): ${u.reason}`)),
  );
  if (!schema.unavailable.length) $("settings-unavailable").append(el("li", { class: "notes" }, "none: this engine takes every setting its plugin declares"));
  $("settings-json").value = JSON.stringify(mine, null, 2);
  $("settings-notes").replaceChildren(...(view.notes ?? []).map((n) => el("li", {}, n)));
}

async function saveJson() {
  const id = $("settings-model").value;
  try {
    const map = JSON.parse($("settings-json").value || "{}");
    const view = await api(`/api/models/${encodeURIComponent(id)}/settings`, "PUT", map);
    stored.set(id, view.stored);
    settingsResult(`saved settings of ${id}`, false);
    await showSettings();
  } catch (e) {
    settingsResult(e instanceof SyntaxError ? `not JSON: ${e.message}` : e.message, true);
  }
}

// ------------------------------------------------------------------- chat

const history = [];

async function chat(event) {
  event.preventDefault();
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text) return;
  const model = $("chat-model").value;
  const log = $("chat-log");
  history.push({ role: "user", content: text });
  log.append(el("div", { class: "turn user" }, text));
  input.value = "";
  const answer = el("div", { class: "turn assistant", "data-done": "false" });
  log.append(answer);
  $("chat-send").disabled = true;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model, messages: history, stream: true, max_tokens: Number($("chat-max-tokens").value) || 64 }),
    });
    if (!response.ok) throw await failure(response);
    let finish = null;
    let chunks = 0;
    await eventsOf(response, (_, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error.message);
      const choice = chunk.choices?.[0];
      const delta = choice?.delta?.content;
      if (delta) {
        chunks += 1;
        answer.append(delta);
        answer.dataset.chunks = String(chunks);
      }
      if (choice?.finish_reason) finish = choice.finish_reason;
    });
    history.push({ role: "assistant", content: answer.textContent });
    answer.dataset.done = "true";
    answer.title = `finish: ${finish ?? "?"}`;
  } catch (e) {
    answer.classList.add("error");
    answer.textContent = e.message;
    answer.dataset.done = "error";
    history.pop();
  } finally {
    $("chat-send").disabled = false;
  }
}

// ----------------------------------------------------------------- browse

/** Searches the hub (through the host, which knows HF_ENDPOINT and HF_TOKEN). */
async function browse(event) {
  event.preventDefault();
  const text = $("browse-search").value.trim();
  const found = await act("search", () => api(`/api/hub/models?search=${encodeURIComponent(text)}`));
  if (!found) return;
  $("browse-hub").textContent = `at ${found.endpoint}`;
  $("browse-results").replaceChildren(
    ...(found.models.length
      ? found.models.map((m) =>
          el(
            "tr",
            { "data-repo": m.id },
            el("td", {}, m.id),
            el("td", {}, m.downloads ?? ""),
            el("td", {}, m.likes ?? ""),
            el("td", {}, el("button", { type: "button", class: "show", onclick: () => showRepo(m.id) }, "Show")),
          ),
        )
      : [el("tr", {}, el("td", { colspan: 4 }, `nothing on the hub matches '${text}'`))]),
  );
}

/** A repository's files, sizes and engine, with a Pull button. */
async function showRepo(repo) {
  const path = repo.split("/").map(encodeURIComponent).join("/");
  const plan = await act("look-up", () => api(`/api/hub/models/${path}`));
  if (!plan) return;
  const servable = plan.engine !== null;
  const fits = plan.fits !== false;
  const force = el("input", { type: "checkbox", class: "force" });
  $("browse-detail").replaceChildren(
    el(
      "div",
      { "data-repo": plan.repo },
      el("h3", {}, `${plan.repo}@${plan.revision} `, el("small", {}, plan.commit)),
      el(
        "p",
        { class: servable ? "ok engine" : "error engine" },
        servable ? `format ${plan.format}, served by ${plan.engine} (${plan.reason})` : `no installed plugin serves it: ${plan.reason}`,
      ),
      el(
        "p",
        { class: fits ? "" : "error" },
        `${bytes(plan.total_bytes)} in ${plan.files.length} file(s), ${bytes(plan.to_fetch)} to fetch; ` +
          `needs about ${bytes(plan.need_bytes)} of memory` +
          (plan.ceiling_bytes === null ? "" : fits ? `, fits under ${bytes(plan.ceiling_bytes)}` : `, more than the ceiling of ${bytes(plan.ceiling_bytes)}`),
      ),
      el(
        "table",
        { class: "files" },
        el("thead", {}, el("tr", {}, el("th", {}, "file"), el("th", {}, "size"), el("th", {}, "cached"))),
        el(
          "tbody",
          {},
          plan.files.map((f) => el("tr", {}, el("td", {}, f.path), el("td", {}, bytes(f.size)), el("td", {}, f.cached ? "yes" : ""))),
        ),
      ),
      el(
        "p",
        {},
        servable && fits ? "" : el("label", {}, force, " pull anyway (force) "),
        el("button", { type: "button", class: "pull", onclick: () => startPull(plan.repo, plan.revision, force.checked) }, "Pull"),
      ),
    ),
  );
}

async function startPull(repo, revision, force) {
  const pull = await act("pull", () => api("/api/models/pull", "POST", { repo, revision, force }));
  if (pull) followPull(pull);
}

/** The pull's row, kept up to date from its event stream until it ends. */
function followPull(pull) {
  const bar = el("progress", { max: pull.bytes_total || 1, value: pull.bytes_done });
  const state = el("td", { class: "state" }, pull.state);
  const rate = el("td", {}, "");
  const cancel = el("button", { type: "button", class: "cancel", onclick: () => act("cancel", () => api(`/api/models/pulls/${pull.id}`, "DELETE")) }, "Cancel");
  const row = el("tr", { "data-pull": pull.id }, el("td", {}, pull.id), el("td", {}, pull.repo), state, el("td", {}, bar), rate, el("td", {}, cancel));
  document.querySelector(`#pulls-body tr[data-pull='${pull.id}']`)?.remove();
  $("pulls-body").append(row);
  const ended = (text, bad = false) => {
    state.textContent = text;
    state.className = bad ? "state error" : "state ok";
    cancel.remove();
  };
  if (["done", "failed", "cancelled"].includes(pull.state)) {
    bar.value = pull.state === "done" ? bar.max : pull.bytes_done;
    return ended(pull.error ? `${pull.state}: ${pull.error}` : pull.state, pull.state === "failed");
  }
  follow(`/api/models/pulls/${pull.id}/events`, (_name, data) => {
    const event = JSON.parse(data);
    if (event.event === "progress") {
      state.textContent = "running";
      bar.value = event.bytes;
      rate.textContent = `${bytes(event.bytes_per_second)}/s`;
    } else if (event.event === "done") {
      bar.value = bar.max;
      ended("done");
      refresh();
    } else if (event.event === "failed") {
      ended(`failed: ${event.message}`, true);
    } else if (event.event === "cancelled") {
      ended("cancelled");
    }
  }).catch((e) => ended(`lost: ${e.message}`, true));
}

async function showPulls() {
  const { pulls } = await api("/api/models/pulls");
  $("pulls-body").replaceChildren();
  pulls.forEach(followPull);
}

// ------------------------------------------------------------------ start

async function refresh() {
  try {
    await showModels();
  } catch (e) {
    status(e.message, true);
  }
}

/**
 * Starts (or restarts, after a new key) the page: asks /health first,
 * which answers without the key, so a page without the right key shows
 * that instead of a row of refused calls.
 */
async function start() {
  const health = await fetch("/health", { headers: headers() }).then((r) => r.json());
  if (!("sessions" in health)) {
    status("this host needs its API key: enter it above", true);
    return;
  }
  status(`host ${health.status}`);
  try {
    await Promise.all([showEngines(), showModels(), showPulls()]);
    await showSettings();
  } catch (e) {
    status(e.message, true);
  }
  followEvents();
}

$("api-key").value = sessionStorage.getItem(KEY) ?? "";
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("api-key").value.trim());
  start();
});
$("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  $("api-key").value = "";
  events?.abort();
  logs?.abort();
  start();
});
$("rescan").addEventListener("click", () => act("rescan", () => api("/api/models/rescan", "POST")));
$("settings-model").addEventListener("change", showSettings);
$("settings-json-save").addEventListener("click", saveJson);
$("chat-form").addEventListener("submit", chat);
$("browse-form").addEventListener("submit", browse);
$("chat-clear").addEventListener("click", () => {
  history.length = 0;
  $("chat-log").replaceChildren();
});
start();
