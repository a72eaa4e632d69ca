// The dashboard page: see dashboard.hpp. Everything the page shows is built with DOM calls
// (textContent, never innerHTML): node names come from workers.

#include "apps/dashboard.hpp"

namespace oobleck::apps {

namespace {

constexpr std::string_view page = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>oobleck</title>
<style>
  :root { --fg: #1d2430; --muted: #6b7280; --line: #d9dee6; --bg: #f6f7f9; --card: #fff;
          --loss: #2563eb; --eval: #dc2626; --speed: #059669; --reconf: #d97706; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
  header { display: flex; flex-wrap: wrap; gap: 18px; align-items: baseline; padding: 12px 20px; background: var(--card);
           border-bottom: 1px solid var(--line); }
  header h1 { font-size: 18px; margin: 0; }
  .kv { color: var(--muted); } .kv b { color: var(--fg); font-weight: 600; }
  #connection.bad { color: #b91c1c; font-weight: 600; }
  main { display: grid; grid-template-columns: minmax(280px, 1fr) 2fr; gap: 16px; padding: 16px 20px; }
  section { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px; min-width: 0; }
  section h2 { font-size: 14px; margin: 0 0 8px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid var(--line); white-space: nowrap; }
  th { color: var(--muted); font-weight: 500; }
  .state { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; background: #e5e7eb; }
  .state.training { background: #d1fae5; color: #065f46; } .state.lost { background: #fee2e2; color: #991b1b; }
  .state.idle { background: #fef3c7; color: #92400e; } .state.joining, .state.registered { background: #dbeafe; color: #1e40af; }
  .pipeline { margin: 0 0 10px; }
  .pipeline .title { font-weight: 600; margin-bottom: 4px; }
  .stages { display: flex; flex-wrap: wrap; gap: 4px; }
  .stage { border: 1px solid var(--line); border-left: 3px solid var(--loss); border-radius: 4px; padding: 3px 8px; font-size: 12px; }
  .stage .layers { color: var(--muted); }
  .charts { grid-column: 1 / -1; }
  .chart { margin-bottom: 10px; }
  .chart h3 { font-size: 13px; margin: 4px 0; font-weight: 600; }
  .legend span { margin-right: 14px; font-size: 12px; } .legend i { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin-right: 4px; }
  svg { width: 100%; height: auto; max-height: 320px; display: block; }
  svg text { font-size: 11px; fill: var(--muted); }
  svg .axis { stroke: #9ca3af; stroke-width: 1; } svg .grid { stroke: var(--line); stroke-width: 1; }
  svg .series { fill: none; stroke-width: 1.8; stroke-linejoin: round; }
  svg .loss { stroke: var(--loss); } svg .eval { stroke: var(--eval); stroke-dasharray: 5 3; } svg .speed { stroke: var(--speed); }
  svg .reconfiguration { stroke: var(--reconf); stroke-width: 1.2; stroke-dasharray: 3 3; }
  svg .dot.eval { fill: var(--eval); }
  .empty { color: var(--muted); font-style: italic; }
  @media (max-width: 800px) { main { grid-template-columns: 1fr; } }
</style>
</head>
<body data-updates="0">
<header>
  <h1>oobleck</h1>
  <span class="kv">state <b id="job-state">…</b></span>
  <span class="kv">epoch <b id="job-epoch">…</b></span>
  <span class="kv">committed steps <b id="job-steps">…</b></span>
  <span class="kv">loss <b id="job-loss">…</b></span>
  <span class="kv">samples/s <b id="job-speed">…</b></span>
  <span class="kv">eval loss <b id="job-eval">–</b></span>
  <span class="kv" id="connection">connecting…</span>
</header>
<main>
  <section id="nodes-section">
    <h2>Nodes</h2>
    <table id="nodes"><thead><tr><th>id</th><th>name</th><th>state</th><th>rank</th></tr></thead><tbody></tbody></table>
  </section>
  <section id="pipelines-section">
    <h2>Pipelines</h2>
    <div id="pipelines"><p class="empty">no epoch yet</p></div>
  </section>
  <section class="charts">
    <h2>Training</h2>
    <div class="chart">
      <h3>Loss</h3>
      <div class="legend"><span><i style="background:var(--loss)"></i>training loss</span><span><i style="background:var(--eval)"></i>eval loss</span><span><i style="background:var(--reconf)"></i>reconfiguration</span></div>
      <svg id="loss-chart" viewBox="0 0 900 240"></svg>
    </div>
    <div class="chart">
      <h3>Samples/s</h3>
      <svg id="speed-chart" viewBox="0 0 900 240"></svg>
    </div>
    <div id="reconfigurations"></div>
  </section>
</main>
<script>
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const W = 900, H = 240, PAD = { l: 56, r: 12, t: 10, b: 26 };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  return Number(v).toFixed(digits);
}
/// The smallest of 1, 2, 5 times a power of ten that is at least v (> 0).
function nice(v) {
  const mag = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map(m => m * mag).find(m => m >= v * (1 - 1e-9));
}

function renderStatus(s, names) {
  document.getElementById("job-state").textContent = s.state;
  document.getElementById("job-epoch").textContent = s.epoch;
  document.getElementById("job-steps").textContent = s.committed_steps;
  document.getElementById("job-loss").textContent = s.committed_steps > 0 ? fmt(s.last_loss, 4) : "–";
  document.getElementById("job-speed").textContent = s.committed_steps > 0 ? fmt(s.samples_per_second, 1) : "–";

  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of s.nodes) {
    names[n.node] = n.name;
    const tr = el("tr", { "class": "node", "data-node": n.node, "data-name": n.name, "data-state": n.state });
    tr.append(el("td", {}, n.node), el("td", {}, n.name));
    const td = el("td");
    td.append(el("span", { "class": "state " + n.state }, n.state));
    tr.append(td, el("td", {}, n.rank >= 0 ? n.rank : "–"));
    body.append(tr);
  }

  const box = document.getElementById("pipelines");
  box.replaceChildren();
  if (!s.pipelines.length) box.append(el("p", { "class": "empty" }, "no epoch yet"));
  s.pipelines.forEach((p, i) => {
    const div = el("div", { "class": "pipeline", "data-pipeline": i, "data-microbatches": p.microbatches });
    div.append(el("div", { "class": "title" }, "pipeline " + i + " · " + p.microbatches + " microbatch(es) · " +
                                                p.nodes.length + " node(s)"));
    const stages = el("div", { "class": "stages" });
    // Nodes are in stage order; stage_layers (when the status has them) bound each stage's layers.
    const layers = p.stage_layers || [];
    const count = layers.length > 1 ? layers.length - 1 : p.nodes.length;
    for (let k = 0; k < count; ++k) {
      const node = count === p.nodes.length ? p.nodes[k] : undefined;
      const st = el("div", { "class": "stage", "data-pipeline": i, "data-stage": k });
      if (node !== undefined) st.setAttribute("data-node", node);
      st.append(el("div", {}, "stage " + k));
      if (node !== undefined) st.append(el("div", {}, (names[node] || "node") + " (node " + node + ")"));
      if (count === layers.length - 1)
        st.append(el("div", { "class": "layers" }, "layers " + layers[k] + "–" + (layers[k + 1] - 1)));
      stages.append(st);
    }
    if (count !== p.nodes.length)
      stages.append(el("div", { "class": "stage-nodes" }, "on nodes " + p.nodes.join(", ")));
    div.append(stages);
    box.append(div);
  });
}

/// One chart: series [{cls, points: [[x, y|null], ...], dots}], vertical marks at steps.
function chart(id, series, marks) {
  const root = document.getElementById(id);
  root.replaceChildren();
  const xs = [], ys = [];
  for (const s of series) for (const [x, y] of s.points) { xs.push(x); if (y !== null && isFinite(y)) ys.push(y); }
  for (const m of marks) xs.push(m.step);
  if (!ys.length) {
    root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", "class": "empty" }, "no steps yet"));
    return;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.05 + 0.5; y1 += Math.abs(y1) * 0.05 + 0.5; }
  // Round ticks (1, 2 or 5 times a power of ten apart), the range widened to them.
  const yStep = nice((y1 - y0) / 4);
  y0 = Math.floor(y0 / yStep) * yStep; y1 = Math.ceil(y1 / yStep) * yStep;
  const digits = Math.max(0, -Math.floor(Math.log10(yStep)));
  const px = x => PAD.l + (x - x0) / (x1 - x0) * (W - PAD.l - PAD.r);
  const py = y => H - PAD.b - (y - y0) / (y1 - y0) * (H - PAD.t - PAD.b);
  for (let k = 0, y = y0; y <= y1 + yStep / 2 && k < 12; ++k, y = y0 + k * yStep) {
    root.append(svg("line", { "class": "grid", x1: PAD.l, x2: W - PAD.r, y1: py(y), y2: py(y) }));
    root.append(svg("text", { x: PAD.l - 6, y: py(y) + 4, "text-anchor": "end" },
                    Math.abs(y) >= 1e5 ? y.toExponential(1) : y.toFixed(digits)));
  }
  // Steps are integers: ticks at a round integer spacing.
  const every = Math.max(1, nice((x1 - x0) / 6));
  for (let x = Math.ceil(x0 / every) * every; x <= x1; x += every)
    root.append(svg("text", { x: px(x), y: H - 8, "text-anchor": "middle" }, x));
  root.append(svg("line", { "class": "axis", x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b }));
  root.append(svg("line", { "class": "axis", x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b }));
  for (const m of marks) {
    const line = svg("line", { "class": "reconfiguration", "data-step": m.step, x1: px(m.step), x2: px(m.step),
                               y1: PAD.t, y2: H - PAD.b });
    line.append(svg("title", {}, m.title));
    root.append(line);
  }
  for (const s of series) {
    let d = "", pen = false, n = 0;
    for (const [x, y] of s.points) {
      if (y === null || !isFinite(y)) { pen = false; continue; }
      d += (pen ? "L" : "M") + px(x).toFixed(1) + " " + py(y).toFixed(1);
      pen = true; ++n;
      if (s.dots && s.points.length <= 60) root.append(svg("circle", { "class": "dot " + s.cls, cx: px(x), cy: py(y), r: 3 }));
    }
    root.append(svg("path", { "class": "series " + s.cls, "data-points": n, d: d }));
  }
}

function renderHistory(h) {
  const lastEval = h.evals.length ? h.evals[h.evals.length - 1] : null;
  document.getElementById("job-eval").textContent = lastEval ? fmt(lastEval.loss, 4) + " at step " + lastEval.step : "–";
  const steps = h.steps.slice();
  const last = h.last_step;
  if (last && (!steps.length || steps[steps.length - 1].step < last.step)) steps.push(last);
  const marks = h.reconfigurations.map(r => ({
    step: r.step,
    title: "epoch " + r.epoch + " at step " + r.step + ": " + r.action +
           (r.lost.length ? ", lost " + r.lost.join(",") : "") + (r.joined.length ? ", joined " + r.joined.join(",") : "") +
           (r.downtime_ms !== null ? ", down " + fmt(r.downtime_ms / 1000, 1) + " s" : "")
  }));
  chart("loss-chart", [
    { cls: "loss", points: steps.map(s => [s.step, s.loss]) },
    { cls: "eval", points: h.evals.map(e => [e.step, e.loss]), dots: true }
  ], marks);
  chart("speed-chart", [{ cls: "speed", points: steps.map(s => [s.step, s.samples_per_second]) }], marks);
  const list = document.getElementById("reconfigurations");
  list.replaceChildren();
  if (marks.length) {
    list.append(el("h3", {}, "Reconfigurations"));
    const ul = el("ul");
    for (const m of marks) ul.append(el("li", { "class": "reconfiguration-item", "data-step": m.step }, m.title));
    list.append(ul);
  }
}

const names = {};
async function poll() {
  const conn = document.getElementById("connection");
  try {
    const s = await fetch("status", { cache: "no-store" });
    if (!s.ok) throw new Error("status: HTTP " + s.status);
    renderStatus(await s.json(), names);
    const h = await fetch("history", { cache: "no-store" });
    if (h.ok) renderHistory(await h.json());
    conn.textContent = "updated " + new Date().toLocaleTimeString();
    conn.className = "kv";
    document.body.dataset.updates = Number(document.body.dataset.updates) + 1;
  } catch (e) {
    conn.textContent = "no answer from the coordinator (" + e.message + ")";
    conn.className = "kv bad";
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
)html";

}  // namespace

std::string_view dashboard_html() { return page; }

}  // namespace oobleck::apps
