// Queues view: each queue's GPUs in use against its quota, what it borrows, what waits.
import { api } from "./api.js";
import { bar, h } from "./format.js";

function quota(queue) {
  return queue.quota === null ? "what others leave" : `${queue.quota} GPU${queue.quota === 1 ? "" : "s"}`;
}

function limit(queue) {
  return queue.borrowing_limit === null ? "no limit" : `${queue.borrowing_limit}`;
}

export function queuesView() {
  const body = h("tbody");
  const element = h("div", {},
    h("h1", {}, "Queues"),
    h("p", { class: "muted" },
      "Each queue is guaranteed its quota while its jobs want it, borrows idle GPUs up to its limit, ",
      "and gives them back (its jobs checkpoint and wait) when their queue needs them."),
    h("table", { id: "queues" },
      h("thead", {}, h("tr", {}, ["Queue", "Parent", "Quota", "In use", "Borrowed", "Borrowing limit", "Weight", "Admitted", "Pending", "Users"]
        .map((c) => h("th", {}, c)))),
      body));
  return {
    title: "Queues",
    element,
    async refresh() {
      const { items } = await api("/queues");
      body.replaceChildren(...items.map((queue) => h("tr", { "data-queue": queue.name },
        h("td", {}, queue.name),
        h("td", {}, queue.parent || "–"),
        h("td", {}, quota(queue)),
        h("td", {},
          `${queue.gpus_in_use}`,
          queue.quota ? bar(queue.gpus_in_use / queue.quota, `${queue.gpus_in_use} of ${queue.quota} GPUs`) : []),
        h("td", { class: "num" }, queue.borrowed_gpus),
        h("td", {}, limit(queue)),
        h("td", { class: "num" }, queue.weight),
        h("td", { class: "num" }, queue.admitted_jobs),
        h("td", { class: "num" }, queue.pending_jobs),
        h("td", {}, queue.users.length ? queue.users.join(", ") : "everyone"))));
    },
  };
}
