// Receipt console: the live parts of a job page (its output and receipts) over the job's event
// stream. No framework, no build step; served by the api like every other asset.
"use strict";

function text(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function progressLines(data) {
  if (data && Array.isArray(data.lines)) return data.lines.map(String);
  if (data && typeof data.line === "string") return [data.line];
  return [text(data)];
}

// What a live job page keeps: a runaway job's output must not grow the page without end nor
// hold the browser's main thread (its Abort button with it).
const OUTPUT_LINES = 5000;
const TIMELINE_ROWS = 2000;

function followJob(output) {
  const timeline = document.getElementById("timeline");
  const status = document.getElementById("status");
  const source = new EventSource(output.dataset.events);
  let previous = timeline.dataset.lastAt ? new Date(timeline.dataset.lastAt) : null;
  let lines = output.textContent.split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  let pending = [];
  let scheduled = false;

  const row = (receipt) => {
    const at = new Date(receipt.recordedAt);
    const tr = document.createElement("tr");
    const fence = receipt.data.workerId || receipt.data.attempt != null
      ? `${receipt.data.workerId || "—"} · attempt ${receipt.data.attempt}` : "";
    const cells = [receipt.seq, receipt.type, receipt.recordedAt,
      previous ? `+${Math.round(at - previous)} ms` : "", fence, text(receipt.data).slice(0, 400)];
    previous = at;
    cells.forEach((value, index) => {
      const cell = document.createElement("td");
      if (index === cells.length - 1) {
        const code = document.createElement("code");
        code.textContent = String(value);
        cell.append(code);
      } else {
        cell.textContent = String(value);
      }
      tr.append(cell);
    });
    return tr;
  };

  // Everything that arrived since the last frame, in one change of the page per frame.
  let grew = false;
  const flush = () => {
    scheduled = false;
    const rows = document.createDocumentFragment();
    for (const receipt of pending) rows.append(row(receipt));
    pending = [];
    if (grew) {
      grew = false;
      if (lines.length > OUTPUT_LINES) lines = lines.slice(-OUTPUT_LINES);
      output.textContent = lines.join("\n") + "\n";
      output.scrollTop = output.scrollHeight;
    }
    timeline.append(rows);
    while (timeline.rows.length > TIMELINE_ROWS) timeline.deleteRow(0);
  };

  source.onmessage = (message) => {
    const receipt = JSON.parse(message.data);
    if (receipt.type === "job.progress") {
      lines.push(...progressLines(receipt.data.data));
      if (lines.length > 2 * OUTPUT_LINES) lines = lines.slice(-OUTPUT_LINES);
      grew = true;
    }
    pending.push(receipt);
    if (pending.length > 2 * TIMELINE_ROWS) pending = pending.slice(-TIMELINE_ROWS);
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(flush);
    }
  };
  source.addEventListener("end", (event) => {
    const end = JSON.parse(event.data);
    status.textContent = end.status;
    status.className = `badge status-${end.status}`;
    source.close();
  });
}

// An objective's graph: poll its state (the console session authenticates it) and recolour the
// nodes until the objective is settled and audited, then reload once to show the audit.
function followGraph(graph) {
  const status = document.getElementById("status");
  const refresh = async () => {
    const answer = await fetch(graph.dataset.state, { credentials: "same-origin" });
    if (answer.status === 401) clearInterval(timer);  // the session ended: reload to sign in
    if (!answer.ok) return;
    const state = await answer.json();
    for (const [key, node] of Object.entries(state.nodes)) {
      const group = graph.querySelector(`g.node[data-key="${CSS.escape(key)}"]`);
      if (!group) continue;
      group.setAttribute("class", `node status-${node.status}`);
      group.querySelector(".state").textContent = node.status;
    }
    status.textContent = state.status;
    status.className = `badge status-${state.status}`;
    if (state.status !== "active" && state.audited) {
      clearInterval(timer);
      window.location.reload();
    }
  };
  const timer = setInterval(refresh, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  const output = document.getElementById("output");
  if (output && output.dataset.live === "yes") followJob(output);
  const graph = document.getElementById("graph");
  if (graph && graph.dataset.live === "yes") followGraph(graph);
});
