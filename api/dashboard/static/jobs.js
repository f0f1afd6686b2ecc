// Jobs view: a filterable table, paged newest first with the API's keyset cursor.
import { api } from "./api.js";
import { ago, badge, bar, duration, h, jct, positionText, STATES, TERMINAL } from "./format.js";

const PAGE = 25;

function progress(job) {
  const total = job.spec && job.spec.max_iterations;
  const done = Math.floor(job.progress); // an adaptive batch's steps count AdaScale's gain
  if (!total) return h("span", {}, done.toLocaleString());
  return h("div", { class: "progress" }, bar(done / total), h("span", { class: "muted" }, `${done}/${total}`));
}

export function jobsView() {
  const state = h("select", { name: "state", "aria-label": "State" },
    h("option", { value: "" }, "All states"), STATES.map((s) => h("option", { value: s }, s)));
  const owner = h("input", { name: "owner", placeholder: "Owner", size: 12, "aria-label": "Owner" });
  const summary = h("span", { class: "muted" });
  const body = h("tbody");
  const newer = h("button", { type: "button" }, "← Newer");
  const older = h("button", { type: "button" }, "Older →");
  let cursors = [null]; // `after` of each page seen; the last is the current page's
  let next = null;
  let view;

  const restart = () => { cursors = [null]; view.refresh(); };
  state.addEventListener("change", restart);
  owner.addEventListener("change", restart);
  newer.addEventListener("click", () => { cursors.pop(); view.refresh(); });
  older.addEventListener("click", () => { cursors.push(next); view.refresh(); });

  const element = h("div", {},
    h("h1", {}, "Jobs"),
    h("div", { class: "toolbar" }, state, owner, summary),
    h("table", { id: "jobs" },
      h("thead", {}, h("tr", {},
        ["ID", "Name", "State", "Owner", "Priority", "GPUs", "Progress", "JCT", "Submitted"].map((c) =>
          h("th", { class: ["Priority", "GPUs", "JCT"].includes(c) ? "num" : undefined }, c)))),
      body),
    h("div", { class: "pager" }, newer, older));

  view = {
    title: "Jobs",
    element,
    async refresh() {
      const page = await api("/jobs", {
        query: { state: state.value, owner: owner.value.trim(), limit: PAGE, after: cursors[cursors.length - 1] },
      });
      next = page.next_after;
      newer.disabled = cursors.length === 1;
      older.disabled = next === null;
      const first = (cursors.length - 1) * PAGE;
      summary.textContent = page.total
        ? `${first + 1}–${first + page.items.length} of ${page.total}`
        : "";
      body.replaceChildren(...(page.items.length ? page.items.map((job) => {
        const row = h("tr", { class: "clickable", "data-job": job.id, onclick: () => { location.hash = `#/jobs/${job.id}`; } },
          h("td", {}, h("a", { href: `#/jobs/${job.id}` }, job.id)),
          h("td", {}, job.name),
          h("td", {}, badge(job.state),
            job.pending_reason ? h("div", { class: "pending-reason" }, job.pending_reason) : [],
            job.position ? h("div", { class: "position muted" }, positionText(job)) : []),
          h("td", {}, job.owner),
          h("td", { class: "num" }, job.priority),
          h("td", { class: "num" }, job.workers),
          h("td", {}, progress(job)),
          h("td", { class: "num", title: TERMINAL.has(job.state) ? "submission to end" : "so far" },
            TERMINAL.has(job.state) ? duration(jct(job)) : h("span", { class: "muted" }, duration(jct(job)))),
          h("td", {}, ago(job.created_at)));
        return row;
      }) : [h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No jobs match."))]));
    },
  };
  return view;
}
