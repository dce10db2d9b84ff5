// Admin tab (admin keys only): Triton's models with load / unload, API keys (create, with the
// secret shown once; revoke), what each key used, this month's spend by key, project, model
// or day with the budgets' use (docs/budgets.md), the batches not yet ended
// (docs/batches.md) and the audit log of admin actions, all from the /admin API.

import { call, callJson } from "./api.js";
import { $, busy, clearError, el, optionalNumber, showError } from "./ui.js";

let afterModelChange = async () => {};
/** Key id -> name, from the keys table as last loaded (the batches table names its keys). */
let keyNames = new Map();

function fail(failure) {
  showError($("admin-error"), failure);
}

function button(text, testid, action) {
  const b = el("button", text, { type: "button", "data-testid": testid });
  b.addEventListener("click", () => busy(b, async () => {
    clearError($("admin-error"));
    try {
      await action();
    } catch (failure) {
      fail(failure);
    }
  }));
  return b;
}

async function showModels() {
  const { data } = await callJson("/admin/models");
  const rows = data.map((model) => {
    const ready = model.state === "READY";
    const row = el("tr", "", { "data-model": model.id, "data-state": model.state || "" });
    const state = el("td", model.state || "not loaded", { "data-testid": `admin-state-${model.id}` });
    if (model.reason) state.title = model.reason;
    const action = ready ? "unload" : "load";
    const control = button(ready ? "Unload" : "Load", `admin-${action}-${model.id}`, async () => {
      state.textContent = ready ? "unloading…" : "loading…";
      try {
        await call(`/admin/models/${encodeURIComponent(model.id)}/${action}`, { method: "POST" });
      } finally {
        await showModels();
      }
      await Promise.all([afterModelChange(), showAudit()]);
    });
    row.append(el("th", model.id, { scope: "row" }), el("td", model.task || ""), state, el("td"));
    row.lastChild.append(control);
    return row;
  });
  $("admin-models").tBodies[0].replaceChildren(...rows);
}

function limits(key) {
  const parts = [["rpm", key.rpm], ["tpm", key.tpm], ["concurrency", key.max_concurrency]];
  const shown = parts.filter(([, v]) => v != null).map(([n, v]) => `${v} ${n}`);
  shown.push(...budgetText(key.budget));
  if (key.project) shown.push(`project ${key.project}`);
  return shown.join(", ") || "none";
}

/** A budget's limits as text: "5000000 tokens/month", "20 cost/day". */
function budgetText(budget) {
  return Object.entries(budget || {}).filter(([, v]) => v != null)
    .map(([name, v]) => `${v} ${name.replace("_per_", "/")}`);
}

/** "42% of 1000 tokens/day" for each budget of a key or project, from its figures. */
function budgetUse(budget, spent) {
  return Object.entries(budget || {}).filter(([name, v]) => v != null && name.endsWith("_month"))
    .map(([name, v]) => {
      const used = name.startsWith("cost") ? spent.cost : spent.total_tokens;
      return `${Math.round((100 * used) / v)}% of ${v} ${name.replace("_per_", "/")}`;
    }).join(", ");
}

async function showSpend() {
  const by = $("admin-spend-by").value;
  const [{ data }, keys, projects] = await Promise.all([
    callJson(`/admin/spend?group_by=${by}`),
    by === "key" ? callJson("/admin/keys") : { data: [] },
    by === "project" ? callJson("/admin/projects") : { data: [] },
  ]);
  const budgets = new Map([...keys.data, ...projects.data].map((o) => [o.id, o.budget]));
  $("admin-spend-group").textContent = by[0].toUpperCase() + by.slice(1);
  const rows = data.map((row) => {
    const label = row[by];
    const name = row.name ? `${row.name} (${label})` : label;
    const tr = el("tr", "", { "data-group": label });
    tr.append(
      el("th", name, { scope: "row" }),
      el("td", String(row.requests), { "data-testid": `admin-spend-requests-${label}` }),
      el("td", `${row.prompt_tokens} / ${row.completion_tokens}`),
      el("td", row.cost.toFixed(6)),
      el("td", budgetUse(budgets.get(label), row)),
    );
    return tr;
  });
  $("admin-spend").tBodies[0].replaceChildren(...rows);
}

async function showKeys() {
  const { data } = await callJson("/admin/keys");
  data.sort((a, b) => b.created_at - a.created_at);
  keyNames = new Map(data.map((key) => [key.id, key.name]));
  const usages = await Promise.all(data.map((key) => callJson(`/admin/keys/${key.id}/usage`)));
  const rows = data.map((key, i) => {
    const u = usages[i];
    const revoked = key.revoked_at != null;
    const expired = key.expires_at != null && key.expires_at * 1000 <= Date.now();
    const row = el("tr", "", { "data-key": key.id, "data-name": key.name });
    row.append(
      el("th", key.name, { scope: "row" }),
      el("td", key.id),
      el("td", key.role),
      el("td", key.models ? key.models.join(", ") : "all"),
      el("td", limits(key)),
      el("td", String(u.requests), { "data-testid": `admin-requests-${key.id}` }),
      el("td", `${u.prompt_tokens} / ${u.completion_tokens}`),
      el("td", `${u.audio_seconds_in.toFixed(1)} / ${u.audio_seconds_out.toFixed(1)}`),
      el("td", revoked ? "revoked" : expired ? "expired" : "active", { "data-testid": `admin-key-state-${key.id}` }),
      el("td"),
    );
    if (!revoked) {
      row.lastChild.append(button("Revoke", `admin-revoke-${key.id}`, async () => {
        if (!confirm(`Revoke the key "${key.name}" (${key.id})? Apps using it stop at once.`)) return;
        await call(`/admin/keys/${key.id}`, { method: "DELETE" });
        await Promise.all([showKeys(), showAudit()]);
      }));
    }
    return row;
  });
  $("admin-keys").tBodies[0].replaceChildren(...rows);
}

async function createKey() {
  const models = $("admin-key-models").value.split(",").map((m) => m.trim()).filter(Boolean);
  const spec = {
    name: $("admin-key-name").value.trim(),
    role: $("admin-key-role").value,
    rpm: optionalNumber("admin-key-rpm"),
    tpm: optionalNumber("admin-key-tpm"),
    max_concurrency: optionalNumber("admin-key-concurrency"),
    models: models.length ? models : null,
    expires_in_days: optionalNumber("admin-key-days"),
  };
  const created = await callJson("/admin/keys", { method: "POST", json: spec });
  $("admin-new-key-value").textContent = created.key;
  $("admin-new-key").hidden = false;
  $("admin-key-form").reset();
  await Promise.all([showKeys(), showAudit()]);
}

async function showBatches() {
  const { data } = await callJson("/admin/batches");
  data.sort((a, b) => b.created_at - a.created_at);
  const rows = data.map((batch) => {
    const counts = batch.request_counts;
    const row = el("tr", "", { "data-batch": batch.id });
    row.append(
      el("th", batch.id, { scope: "row" }),
      el("td", keyNames.get(batch.owner) ?? batch.owner),
      el("td", batch.endpoint),
      el("td", batch.status, { "data-testid": `admin-batch-status-${batch.id}` }),
      el("td", `${counts.completed + counts.failed}/${counts.total}`, {
        "data-testid": `admin-batch-progress-${batch.id}`,
      }),
      el("td", new Date(batch.created_at * 1000).toLocaleString()),
    );
    if (batch.model) row.title = `model ${batch.model}`;
    return row;
  });
  if (!rows.length) {
    const empty = el("tr");
    empty.append(el("td", "No batches running.", { colspan: "6", class: "hint" }));
    rows.push(empty);
  }
  $("admin-batches").tBodies[0].replaceChildren(...rows);
}

/** The outcome or the request's details, in a few words. */
function auditDetails(entry) {
  return Object.entries(entry.details || {})
    .map(([name, value]) => `${name} ${Array.isArray(value) ? value.join(", ") : value}`)
    .join("; ");
}

async function showAudit() {
  const { data } = await callJson("/admin/audit?limit=50");
  const rows = data.map((entry) => {
    const row = el("tr", "", {
      "data-action": entry.action,
      "data-stage": entry.stage,
      "data-target": entry.target || "",
    });
    row.append(
      el("td", new Date(entry.time * 1000).toLocaleString()),
      el("td", `${entry.actor.name} (${entry.actor.id})`),
      el("td", entry.client || ""),
      el("th", entry.action, { scope: "row" }),
      el("td", entry.target || ""),
      el("td", entry.stage),
      el("td", auditDetails(entry)),
    );
    if (entry.request_id) row.title = `request ${entry.request_id}`;
    return row;
  });
  $("admin-audit").tBodies[0].replaceChildren(...rows);
}

/** Shows the tab's tables, fresh (called whenever the tab is opened). */
export async function showAdmin() {
  clearError($("admin-error"));
  $("admin-new-key").hidden = true;
  $("admin-new-key-value").textContent = "";
  try {
    // The batches follow the keys, whose names they show (or their ids, the keys failing).
    const keysThenBatches = showKeys().finally(showBatches);
    await Promise.all([showModels(), keysThenBatches, showSpend(), showAudit()]);
  } catch (failure) {
    fail(failure);
  }
}

export function setupAdmin(onModelChange) {
  afterModelChange = onModelChange;
  $("admin-refresh").addEventListener("click", showAdmin);
  $("admin-spend-by").addEventListener("change", () => showSpend().catch(fail));
  $("admin-key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = event.submitter || $("admin-key-form").querySelector("button");
    await busy(submit, async () => {
      clearError($("admin-error"));
      try {
        await createKey();
      } catch (failure) {
        fail(failure);
      }
    });
  });
  $("admin-new-key-copy").addEventListener("click", () =>
    navigator.clipboard.writeText($("admin-new-key-value").textContent).catch(() => {}));
}
