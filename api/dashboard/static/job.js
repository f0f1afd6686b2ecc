// Job view: facts and actions, per-iteration charts, leases (SPB), events and logs.
import { api } from "./api.js";
import { lineChart } from "./charts.js";
import { badge, clock, duration, h, jct, number, positionText, spbText, TERMINAL, timestamp } from "./format.js";

const COLORS = { main: "#2563eb", compute: "#059669", comm: "#d97706", step: "#6b7280" };
const LOG_LINES = 2000; // kept in the page; older lines scroll away

function series(points, field, name, color, scale = 1) {
  return { name, color, points: points.map((p) => [p.iteration, p[field] === null ? null : p[field] * scale]) };
}

function charts(points) {
  return [
    lineChart({ id: "throughput", title: "Throughput (samples/s)", series: [series(points, "samples_per_second", "samples/s", COLORS.main)] }),
    lineChart({ id: "loss", title: "Loss", zero: false, series: [series(points, "loss", "loss", COLORS.main)] }),
    lineChart({ id: "utilization", title: "Utilization", unit: "%", series: [series(points, "utilization", "utilization", COLORS.main, 100)] }),
    lineChart({
      id: "step-time", title: "Step time (s): compute and exposed communication",
      series: [series(points, "step_seconds", "step", COLORS.step), series(points, "compute_seconds", "compute", COLORS.compute),
        series(points, "comm_seconds", "communication", COLORS.comm)],
    }),
    lineChart({
      id: "spb-depth", title: "SPB depth (mean fraction of stages backpropagated)", unit: "%",
      series: [series(points, "spb_depth", "depth", COLORS.main, 100)],
      empty: "No SPB depth reported: the job runs full backprop, or its runtime does not report depth",
    }),
    lineChart({ id: "workers", title: "Workers (an elastic job's change at resizes)", series: [series(points, "workers", "workers", COLORS.main)] }),
    lineChart({
      id: "batch", title: "Global batch (an adaptive job's, as the scheduler chose it)",
      series: [series(points, "batch_size", "batch", COLORS.main)],
    }),
  ];
}

// Leases grouped into placements: the allocations created together are one lease.
function leaseRows(allocations) {
  const byLease = new Map();
  for (const a of allocations) {
    const key = `${a.created_at}|${a.lease_start_iteration}`;
    if (!byLease.has(key)) byLease.set(key, []);
    byLease.get(key).push(a);
  }
  return [...byLease.values()].map((group) => {
    const first = group[0];
    const gpus = group.sort((a, b) => a.rank - b.rank).map((a) => `${a.node}/${a.gpu_index}`).join(", ");
    return h("tr", {},
      h("td", {}, timestamp(first.created_at)),
      h("td", {}, first.released_at ? duration((Date.parse(first.released_at) - Date.parse(first.created_at)) / 1000) : badge("active", "RUNNING")),
      h("td", {}, `from ${first.lease_start_iteration}, lease of ${first.lease_iterations}`),
      h("td", {}, gpus),
      h("td", {}, spbText(first.spb)));
  });
}

function eventItem(event) {
  const change = event.to_state ? `${event.from_state || "·"} → ${event.to_state}` : event.kind;
  return h("li", { "data-event": event.id },
    h("span", { class: "muted" }, clock(event.created_at), " "),
    event.to_state ? badge(event.to_state) : badge(event.kind), " ",
    h("strong", {}, change), " ", event.message,
    h("span", { class: "muted" }, event.actor ? ` — ${event.actor}` : ""));
}

export function jobView(jobId) {
  const header = h("div");
  const actions = h("div", { class: "toolbar" });
  const chartBox = h("div", { class: "charts", id: "charts" });
  const leases = h("tbody");
  const timeline = h("ul", { class: "timeline", id: "events" });
  const logs = h("pre", { class: "logs", id: "logs" });
  let eventsAfter = 0, logsAfter = 0, logCount = 0;

  const act = (verb) => h("button", {
    type: "button", class: verb === "cancel" ? "danger" : "",
    onclick: async (event) => {
      event.target.disabled = true;
      try { await api(`/jobs/${jobId}/${verb}`, { method: "POST" }); await view.refresh(); }
      catch (error) { alert(error.message); event.target.disabled = false; }
    },
  }, verb[0].toUpperCase() + verb.slice(1));

  const element = h("div", {},
    header, actions,
    h("h2", {}, "Per-iteration metrics"), chartBox,
    h("h2", {}, "Leases and SPB configuration"),
    h("table", { id: "leases" }, h("thead", {}, h("tr", {}, ["Granted", "Held", "Iterations", "GPUs (node/index by rank)", "SPB"].map((c) => h("th", {}, c)))), leases),
    h("div", { class: "cols" },
      h("section", {}, h("h2", {}, "Events"), h("div", { class: "panel" }, timeline)),
      h("section", {}, h("h2", {}, "Logs"), logs)));

  const view = {
    title: `Job ${jobId}`,
    element,
    async refresh() {
      const [job, metrics, allocations, events, lines] = await Promise.all([
        api(`/jobs/${jobId}`),
        api(`/jobs/${jobId}/metrics`, { query: { points: 300 } }),
        api(`/jobs/${jobId}/allocations`, { query: { limit: 200 } }),
        api(`/jobs/${jobId}/events`, { query: { after: eventsAfter } }),
        api(`/jobs/${jobId}/logs`, { query: { after: logsAfter, limit: 500 } }),
      ]);
      const total = job.spec.max_iterations;
      header.replaceChildren(
        h("h1", {}, `#${job.id} ${job.name} `, badge(job.state)),
        h("dl", { class: "facts panel" },
          job.pending_reason ? [h("dt", {}, "Waiting"), h("dd", { class: "pending-reason" }, job.pending_reason)] : [],
          job.position ? [h("dt", {}, "Position"), h("dd", { class: "position" }, positionText(job))] : [],
          job.estimated_start_at ? [h("dt", {}, "Expected start"), h("dd", {}, timestamp(job.estimated_start_at))] : [],
          h("dt", {}, "Queue"), h("dd", {}, h("a", { href: "#/queues" }, job.queue)),
          h("dt", {}, "Owner"), h("dd", {}, job.owner),
          h("dt", {}, "Workload"), h("dd", {}, h("code", {}, job.spec.workload)),
          h("dt", {}, "GPUs · priority"), h("dd", {}, `${job.workers} · ${job.priority}`),
          h("dt", {}, "Progress"), h("dd", { id: "progress" }, progressText(job, total)),
          h("dt", {}, "SPB requested"), h("dd", {}, typeof job.spec.spb === "string" ? `SPB ${job.spec.spb}` : spbText(job.spec.spb)),
          h("dt", {}, "Completion time"), h("dd", {}, `${duration(jct(job))}${TERMINAL.has(job.state) ? "" : " so far"}`),
          h("dt", {}, "Attempts · crashes"), h("dd", {}, `${job.attempts} · ${job.failures}`),
          h("dt", {}, "Last evaluation"), h("dd", {}, Object.entries(job.metrics).map(([k, v]) => `${k} ${number(v, 4)}`).join(", ") || "–"),
          job.message ? [h("dt", {}, "Message"), h("dd", {}, job.message)] : []));
      actions.replaceChildren(
        ...(job.state === "RUNNING" ? [act("suspend")] : []),
        ...(job.state === "SUSPENDED" ? [act("resume")] : []),
        ...(TERMINAL.has(job.state) ? [] : [act("cancel")]));
      chartBox.replaceChildren(...charts(metrics.points));
      leases.replaceChildren(...(allocations.items.length ? leaseRows(allocations.items)
        : [h("tr", {}, h("td", { colspan: 5, class: "muted" }, "Not placed yet."))]));
      for (const event of events.items) { timeline.append(eventItem(event)); eventsAfter = event.id; }
      if (lines.items.length) {
        const follow = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 20;
        logs.append(lines.items.map((line) => `[${line.rank}] ${line.message}\n`).join(""));
        logCount += lines.items.length;
        if (logCount > LOG_LINES) { logs.textContent = logs.textContent.split("\n").slice(-LOG_LINES).join("\n"); logCount = LOG_LINES; }
        if (follow) logs.scrollTop = logs.scrollHeight;
        logsAfter = lines.next_after;
      }
      logs.dataset.lines = logCount;
    },
  };
  return view;
}

// What max_iterations counts done; an adaptive batch's steps count AdaScale's gain, so
// its optimizer steps are said beside (as `jigsaw job` says it).
function progressText(job, total) {
  const done = Math.floor(job.progress);
  const counted = total ? `${done} / ${total}` : `${done}`;
  if (done === job.iterations_done) return `${counted} iterations`;
  return `${counted} steps of its base batch, in ${job.iterations_done} iterations`;
}
