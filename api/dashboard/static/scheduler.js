// Scheduler view: round latency over time and the recent rounds with their decisions.
import { api } from "./api.js";
import { lineChart } from "./charts.js";
import { badge, clock, h, number, spbText } from "./format.js";

const ROUNDS = 300; // for the latency chart and the statistics
const SHOWN = 50; // rows in the table

function quantile(sorted, q) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : null;
}

function ms(seconds) {
  return seconds === null ? "–" : `${number(seconds * 1000, 1)} ms`;
}

// One decision as a line: its kind, its job, and the details a person wants first.
function decision(d) {
  const { kind, job_id: jobId, ...detail } = d;
  const parts = [];
  if (detail.gpus !== undefined) parts.push(`${detail.gpus} GPU${detail.gpus === 1 ? "" : "s"}`);
  if (detail.nodes) parts.push(`on ${[].concat(detail.nodes).join(", ")}`);
  if (detail.node) parts.push(`node ${detail.node}`);
  if (detail.spb !== undefined) parts.push(spbText(detail.spb));
  if (detail.reason) parts.push(detail.reason);
  const known = new Set(["gpus", "nodes", "node", "spb", "reason", "start_iteration", "lease_iterations", "agent_id", "retry"]);
  for (const [key, value] of Object.entries(detail)) {
    if (!known.has(key)) parts.push(`${key}=${typeof value === "object" ? JSON.stringify(value) : value}`);
  }
  return h("span", { class: "decision", "data-kind": kind },
    badge(kind.replaceAll("_", " "), kind), " ",
    jobId ? h("a", { href: `#/jobs/${jobId}` }, `#${jobId}`) : "", " ",
    h("span", { class: "muted" }, parts.join(" · ")));
}

export function schedulerView() {
  const cards = h("div", { class: "cards", id: "round-stats" });
  const chart = h("div", { class: "charts wide" });
  const onlyDecisions = h("input", { type: "checkbox", checked: true, name: "decisions" });
  const body = h("tbody");
  let view;
  onlyDecisions.addEventListener("change", () => view.refresh());

  const element = h("div", {},
    h("h1", {}, "Scheduler"), cards,
    h("h2", {}, "Round latency"), chart,
    h("h2", {}, "Recent rounds"),
    h("div", { class: "toolbar" }, h("label", {}, onlyDecisions, " Only rounds that decided something")),
    h("table", { id: "rounds" },
      h("thead", {}, h("tr", {}, ["Round", "Time", "Latency", "Replica", "Decisions"].map((c) => h("th", {}, c)))),
      body));

  view = {
    title: "Scheduler",
    element,
    async refresh() {
      const [recent, table] = await Promise.all([
        api("/scheduler/rounds", { query: { limit: ROUNDS } }),
        api("/scheduler/rounds", { query: { limit: SHOWN, decisions: onlyDecisions.checked } }),
      ]);
      const rounds = recent.items;
      const latencies = rounds.map((r) => r.seconds).sort((a, b) => a - b);
      const kinds = {};
      for (const r of rounds) for (const d of r.decisions) kinds[d.kind] = (kinds[d.kind] || 0) + 1;
      const card = (label, value) => h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
      cards.replaceChildren(
        card("Leader", rounds.length ? rounds[0].leader || "–" : "–"),
        card("Rounds shown", rounds.length),
        card("p50 latency", ms(quantile(latencies, 0.5))),
        card("p95 latency", ms(quantile(latencies, 0.95))),
        card("max latency", ms(latencies.length ? latencies[latencies.length - 1] : null)),
        card(`Decisions (last ${rounds.length} rounds)`,
          Object.keys(kinds).length ? h("div", { class: "decisions" }, Object.entries(kinds).map(([k, n]) => badge(`${k.replaceAll("_", " ")} ${n}`, k))) : "none"),
      );
      const points = rounds.slice().reverse().map((r) => [r.id, r.seconds * 1000]);
      chart.replaceChildren(lineChart({
        id: "round-latency", title: "Latency of each round (ms) by round number",
        series: [{ name: "latency", color: "#2563eb", points }],
        empty: "No rounds recorded yet: is a scheduler leader running?",
        xFormat: (x) => String(Math.round(x)),
        width: 1200,
      }));
      body.replaceChildren(...(table.items.length ? table.items.map((r) => h("tr", { "data-round": r.id },
        h("td", {}, r.id),
        h("td", {}, clock(r.started_at)),
        h("td", { class: "num" }, ms(r.seconds)),
        h("td", { class: "mono" }, r.leader),
        h("td", {}, r.error ? [badge("error"), " ", r.error] : "",
          h("div", { class: "decisions" }, r.decisions.map(decision))),
      )) : [h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No rounds to show."))]));
    },
  };
  return view;
}
