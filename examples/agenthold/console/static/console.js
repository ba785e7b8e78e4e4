// The console's few behaviours: live rows on the traffic page, a list
// that follows new approval requests, copying a policy set line, and a
// confirmation before applying a suggestion. No inline script: the
// Content-Security-Policy allows this file only.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  document.addEventListener("click", (e) => {
    const b = e.target.closest("button.copy");
    if (b) {
      navigator.clipboard?.writeText(b.dataset.command);
      b.textContent = "Copied";
    }
  });
  const apply = document.getElementById("apply");
  if (apply) {
    apply.addEventListener("submit", (e) => {
      if (!window.confirm(apply.dataset.confirm)) e.preventDefault();
    });
  }
  if (page === "traffic") traffic();
  if (page === "approvals") {
    const events = new EventSource("/approvals/events");
    const shown = [...document.querySelectorAll("#approvals tr[data-id]")].map((tr) => tr.dataset.id).sort().join(" ");
    events.onmessage = (e) => {
      const m = JSON.parse(e.data);
      // The first event is what waits now: a reload only if the list
      // drawn is not that.
      if (m.pending && m.pending.sort().join(" ") === shown) return;
      window.location.reload();
    };
  }
});

function traffic() {
  const body = document.querySelector("#traffic tbody");
  const filters = document.getElementById("filters");
  let paused = false;
  document.getElementById("pause").addEventListener("click", (e) => {
    paused = !paused;
    e.target.textContent = paused ? "Resume" : "Pause";
  });
  const shown = (row) => {
    const f = new FormData(filters);
    const d = row.dataset;
    return (!f.get("agent") || d.agent === f.get("agent")) &&
      (!f.get("kind") || d.kind === f.get("kind")) &&
      (!f.get("verdict") || (d.allowed === "true") === (f.get("verdict") === "allowed")) &&
      (!f.get("host") || d.host.includes(f.get("host")));
  };
  const refilter = () => body.querySelectorAll("tr").forEach((r) => { r.hidden = !shown(r); });
  filters.addEventListener("input", refilter);
  const cell = (text, cls) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  };
  const events = new EventSource("/traffic/events");
  events.onmessage = (e) => {
    if (paused) return;
    const r = JSON.parse(e.data);
    const tr = document.createElement("tr");
    const allowed = r.allowed === true;
    Object.assign(tr.dataset, { agent: r.agent || "", kind: r.kind || "", allowed: String(allowed), host: r.host || "" });
    let dest = (r.host || "") + (r.port ? ":" + r.port : "");
    if (r.path) dest += " " + (r.method || "") + " " + r.path;
    const when = new Date(r.time).toLocaleTimeString([], { hour12: false }) + "." + String(new Date(r.time).getMilliseconds()).padStart(3, "0");
    tr.append(cell(when), cell(r.agent), cell(r.kind), cell(dest), cell(allowed ? "allowed" : "denied", allowed ? "ok" : "denied"), cell(r.reason), cell(r.rule));
    const last = document.createElement("td");
    if (r.allow_command) {
      const b = document.createElement("button");
      b.className = "copy";
      b.dataset.command = r.allow_command;
      b.textContent = "Copy allow";
      last.append(b);
    }
    tr.append(last);
    tr.hidden = !shown(tr);
    body.prepend(tr);
    while (body.rows.length > 500) body.deleteRow(-1);
  };
}
