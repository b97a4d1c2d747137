// The nonstop web console: plain JavaScript over the admin API (/api/v1), no build step.
// The session token (POST /api/v1/login) is kept in sessionStorage and sent as a Bearer token.
"use strict";

const API = "/api/v1";
let token = sessionStorage.getItem("nonstop-token");
let poller = null;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    node.append(c instanceof Node ? c : (c === null || c === undefined ? "" : String(c)));
  }
  return node;
}

async function call(path, body, method) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(API + path, {
    method: method || "POST", headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (response.status === 401 && path !== "/login") { logout("session expired: log in again"); }
  return { status: response.status, ok: response.ok, data };
}

async function login(event) {
  event.preventDefault();
  const r = await call("/login", { user: $("login-user").value, password: $("login-password").value });
  if (!r.ok) { $("login-error").textContent = `refused (${r.status}): ${r.data && r.data.detail}`; return; }
  token = r.data.token;
  sessionStorage.setItem("nonstop-token", token);
  $("login-error").textContent = "";
  await start();
}

function logout(message) {
  token = null;
  sessionStorage.removeItem("nonstop-token");
  if (poller) clearInterval(poller);
  stopViews();
  $("main").hidden = true; $("logout").hidden = true; $("login").hidden = false;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

async function refresh() {
  const r = await call("/cluster/status", {});
  if (!r.ok) { $("status-error").textContent = `cluster status: ${r.status} ${r.data && r.data.detail}`; return; }
  const s = r.data;
  $("status-error").textContent = "";
  $("cluster-id").textContent = s.cluster || "";
  $("summary").textContent =
    `view ${s.view}, quorum ${s.quorum}, leader ${s.leader || "-"} (term ${s.term || 0}), asked ${s.name}`;
  fill($("nodes").tBodies[0], (s.nodes || []).map(n => {
    const row = el("tr", { "data-node": n.name, "data-state": n.state },
      el("td", {}, n.name), el("td", {}, n.address || "-"));
    row.append(el("td", { class: "state-" + n.state }, n.state));
    row.append(el("td", {}, n.member === undefined ? "-" : (n.member ? "yes" : "no")), el("td", {}, n.pid || "-"));
    return row;
  }));
  fill($("partitions").tBodies[0], byPartitionName(s.partitions || []).map(p => el("tr", { "data-partition": p.name },
    el("td", {}, p.name), el("td", {}, p.state), el("td", {}, p.epoch), el("td", {}, p.active || "-"),
    el("td", {}, (p.nodes || []).map(x => Array.isArray(x) ? x[0] : x).join(",")))));
  showConfigurations(s.configurations);
  setMembers(s.nodes, s.name);
}

// How an argument is typed in: "files" (a list of {file, text}: config.load reads the
// chosen files), "flag" (a boolean), "list" (a,b), "password" (a secret: never shown,
// cleared once sent), or "text".  An optional argument (anyOf [T, null]) is typed in as T.
function inputKind(arguments_, schema) {
  const given = (schema.anyOf || []).filter(s => s.type !== "null");
  if (given.length === 1) schema = given[0];
  if (schema.type === "boolean") return "flag";
  if (schema.format === "password") return "password";
  if (schema.type !== "array") return "text";
  const ref = (schema.items && schema.items.$ref) || "";
  const item = ref ? ((arguments_.$defs || {})[ref.split("/").pop()] || {}) : (schema.items || {});
  const fields = Object.keys(item.properties || {});
  return fields.includes("file") && fields.includes("text") ? "files" : "list";
}

function commandForm(cmd) {
  const id = "cmd-" + cmd.name.replace(/\./g, "-");
  const form = el("form", { id, class: "command" + (cmd.allowed ? "" : " denied") });
  form.append(el("strong", {}, cmd.name.replace(/\./g, " ")), " ");
  const props = (cmd.arguments && cmd.arguments.properties) || {};
  for (const [name, schema] of Object.entries(props)) {
    const kind = inputKind(cmd.arguments, schema);
    const input = kind === "files" ? el("input", { name, type: "file", multiple: "" })
      : kind === "flag" ? el("input", { name, type: "checkbox" })
      : kind === "password" ? el("input", { name, type: "password", autocomplete: "new-password" })
      : el("input", { name, placeholder: kind === "list" ? "a,b (optional)" : name });
    form.append(el("label", {}, name + " "));
    form.lastChild.append(input);
  }
  // A command that answers per node may run on every node of a group (G3): ?group=NAME.
  if (cmd.per_node) {
    form.append(el("label", { class: "group" }, "on group "));
    form.lastChild.append(el("input", { name: "on-group", placeholder: "this node (or: all, a group)" }));
  }
  const button = el("button", { type: "submit" }, "Run");
  form.append(button, " ", el("span", { class: "hint" },
    cmd.summary + (cmd.allowed ? "" : ` (needs ${cmd.permission}: not granted to you)`)));
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const body = {};
    for (const [name, schema] of Object.entries(props)) {
      const input = form.elements[name];
      const kind = inputKind(cmd.arguments, schema);
      if (kind === "files") {
        if (input.files.length === 0) continue;
        body[name] = await Promise.all([...input.files].map(async f => ({ file: f.name, text: await f.text() })));
        continue;
      }
      if (kind === "flag") { if (input.checked) body[name] = true; continue; }
      const value = input.value.trim();
      if (value === "") continue;
      body[name] = kind === "list" ? value.split(",").map(x => x.trim()).filter(Boolean) : value;
    }
    if (cmd.changes && !confirm(`Run ${cmd.name}?`)) return;
    const group = cmd.per_node ? form.elements["on-group"].value.trim() : "";
    const path = cmd.path.slice(API.length) + (group ? "?group=" + encodeURIComponent(group) : "");
    const r = await call(path, body);
    for (const [name, schema] of Object.entries(props)) {
      if (inputKind(cmd.arguments, schema) === "password") form.elements[name].value = "";
    }
    const result = $("result");
    result.className = r.ok ? "" : "refused";
    result.textContent = (r.ok ? `${cmd.name}: ok\n` : `${cmd.name}: refused (${r.status})\n`) +
      JSON.stringify(r.ok ? r.data : (r.data && r.data.detail), null, 2);
    refresh();
  });
  return form;
}

async function start() {
  const me = await call("/whoami", undefined, "GET");
  if (!me.ok) { logout(); return; }
  $("who").textContent = `${me.data.user} (${me.data.roles.join(",")})` + (me.data.node ? ` on node ${me.data.node}` : "");
  $("login").hidden = true; $("main").hidden = false; $("logout").hidden = false;
  const commands = await call("/commands", undefined, "GET");
  $("commands").replaceChildren(...(commands.data || []).map(commandForm));
  startViews();
  await refresh();
  if (poller) clearInterval(poller);
  poller = setInterval(refresh, 2000);
}

$("login-form").addEventListener("submit", login);
$("logout").addEventListener("click", () => logout());
window.confirm = window.confirm || (() => true);
if (token) start();
