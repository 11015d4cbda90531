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

function followJob(output) {
  const timeline = document.getElementById("timeline");
  const status = document.getElementById("status");
  const source = new EventSource(output.dataset.events);
  let previous = timeline.dataset.lastAt ? new Date(timeline.dataset.lastAt) : null;
  source.onmessage = (message) => {
    const receipt = JSON.parse(message.data);
    if (receipt.type === "job.progress") {
      for (const line of progressLines(receipt.data.data)) output.append(line + "\n");
      output.scrollTop = output.scrollHeight;
    }
    const at = new Date(receipt.recordedAt);
    const row = document.createElement("tr");
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
      row.append(cell);
    });
    timeline.append(row);
  };
  source.addEventListener("end", (event) => {
    const end = JSON.parse(event.data);
    status.textContent = end.status;
    status.className = `badge status-${end.status}`;
    source.close();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const output = document.getElementById("output");
  if (output && output.dataset.live === "yes") followJob(output);
});
