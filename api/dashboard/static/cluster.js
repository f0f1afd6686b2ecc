// Cluster view: totals, then every node and its GPUs with the jobs on them.
import { api } from "./api.js";
import { ago, badge, bar, h, jobColor, percent, spbText } from "./format.js";

function card(label, value, title) {
  return h("div", { class: "card", title }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

function gpuTile(gpu) {
  const title = h("div", { class: "title" }, h("span", {}, `GPU ${gpu.index}`), h("span", {}, gpu.virtual ? "virtual" : gpu.kind));
  if (gpu.holders.length === 0) {
    return h("div", { class: "gpu free", "data-gpu": gpu.id }, title, h("div", {}, "free"));
  }
  const tile = h("div", { class: "gpu busy", "data-gpu": gpu.id }, title);
  for (const holder of gpu.holders) {
    if (holder.job_id === null) {
      tile.append(h("div", { class: "job muted" }, "another user's job"));
      continue;
    }
    tile.style.borderLeftColor = jobColor(holder.job_id);
    tile.append(
      h("div", { class: "job" }, h("a", { href: `#/jobs/${holder.job_id}` }, `#${holder.job_id} ${holder.job_name}`)),
      h("div", { class: "muted" }, `rank ${holder.rank} · ${spbText(holder.spb)}`),
      bar(holder.utilization, `utilization ${percent(holder.utilization)}`),
      h("div", { class: "muted" }, `util ${percent(holder.utilization)}`),
    );
  }
  return tile;
}

// An admin's drain and Kubernetes' verdict are separate: the badge names the first
// reason a node takes no new jobs, the line beside it every reason.
function nodeState(node) {
  if (!node.alive) return "dead";
  if (node.drained_at) return "drained";
  return node.schedulable ? "alive" : "unschedulable";
}

function nodeCard(node) {
  const reasons = [
    node.drained_at ? `drained ${ago(node.drained_at)}` : "",
    node.unschedulable_reason,
  ].filter(Boolean).join(" · ");
  return h("section", { class: "node panel", "data-node": node.name },
    h("header", {},
      h("span", { class: "name" }, node.name),
      badge(nodeState(node)),
      h("span", { class: "muted", title: reasons || undefined },
        reasons || `${node.agent_version || "no agent"} · seen ${ago(node.last_heartbeat_at)}`)),
    h("div", { class: "gpus" }, node.gpus.map(gpuTile)));
}

export function clusterView() {
  const totals = h("div", { class: "cards", id: "totals" });
  const nodes = h("div", { class: "nodes", id: "nodes" });
  const element = h("div", {}, h("h1", {}, "Cluster"), totals, nodes);
  return {
    title: "Cluster",
    element,
    async refresh() {
      const view = await api("/cluster");
      const t = view.totals;
      const window = `last ${Math.round(t.window_seconds / 60)} min`;
      totals.replaceChildren(
        card("GPUs busy", `${t.gpus_busy} / ${t.gpus}`),
        card("GPUs free", t.gpus_free),
        card("GPUs unavailable", t.gpus_unavailable, "on dead, unschedulable or drained nodes"),
        card("Queued jobs", t.jobs_queued),
        card("Running jobs", t.jobs_running),
        card(`Allocation (${window})`, percent(t.allocation), "GPU-seconds held / available"),
        card(`Efficiency (${window})`, percent(t.efficiency), "GPU-seconds held × measured utilization / available"),
      );
      nodes.replaceChildren(...(view.nodes.length
        ? view.nodes.map(nodeCard)
        : [h("p", { class: "muted" }, "No nodes yet: start a worker agent (", h("code", {}, "jigsaw agent"), ").")]));
    },
  };
}
