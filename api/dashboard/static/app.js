// The dashboard's shell: sign-in, hash routing, and polling the active view.
import { api, forgetToken, saveToken, takeTokenFromFragment, token, Unauthorized } from "./api.js";
import { h } from "./format.js";
import { clusterView } from "./cluster.js";
import { jobsView } from "./jobs.js";
import { jobView } from "./job.js";
import { queuesView } from "./queues.js";
import { schedulerView } from "./scheduler.js";

const POLL_MS = 2000;
const main = document.getElementById("main");
const banner = document.getElementById("banner");
const live = document.getElementById("live");
let current = null; // {refresh} of the mounted view
let timer = null;
let generation = 0; // bumps on every navigation, so stale refreshes are dropped

function route() {
  const [path] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "jobs" && parts[1]) return { name: "jobs", make: () => jobView(Number(parts[1])) };
  if (parts[0] === "jobs") return { name: "jobs", make: jobsView };
  if (parts[0] === "queues") return { name: "queues", make: queuesView };
  if (parts[0] === "scheduler") return { name: "scheduler", make: schedulerView };
  return { name: "cluster", make: clusterView };
}

function showError(error) {
  banner.hidden = !error;
  banner.textContent = error ? `Cannot reach the API: ${error.message}. Retrying…` : "";
  live.classList.toggle("stale", !!error);
}

async function refresh(mine) {
  clearTimeout(timer);
  if (!document.hidden && current) {
    try {
      await current.refresh();
      if (mine !== generation) return;
      showError(null);
      live.title = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (mine !== generation) return;
      if (error instanceof Unauthorized) return signIn("Your token was refused; sign in again.");
      showError(error);
    }
  }
  if (mine === generation) timer = setTimeout(() => refresh(mine), POLL_MS);
}

function navigate() {
  if (!token()) return signIn();
  const { name, make } = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.view === name);
  }
  generation += 1;
  current = make();
  main.replaceChildren(current.element);
  document.title = `JigSaw · ${current.title || name}`;
  refresh(generation);
}

function signIn(message) {
  generation += 1;
  clearTimeout(timer);
  current = null;
  forgetToken();
  document.getElementById("whoami").textContent = "";
  document.getElementById("logout").hidden = true;
  document.title = "JigSaw · sign in";
  const input = h("input", { type: "password", name: "token", placeholder: "jsu_…", autocomplete: "off", required: true });
  const remember = h("input", { type: "checkbox", name: "remember" });
  const error = h("p", { class: "error", role: "alert" }, message || "");
  const form = h("form", {
    onsubmit: async (event) => {
      event.preventDefault();
      saveToken(input.value, remember.checked);
      try {
        await whoami();
        if (!location.hash.startsWith("#/") || location.hash === "#/login") location.hash = "#/cluster";
        else navigate();
      } catch (failure) {
        forgetToken();
        error.textContent = failure instanceof Unauthorized ? "That token was refused." : failure.message;
      }
    },
  },
  h("label", {}, "API token", input),
  h("label", {}, remember, " Remember on this computer"),
  h("button", { class: "primary", type: "submit" }, "Sign in"),
  error);
  main.replaceChildren(h("section", { class: "login panel" },
    h("h1", {}, "Sign in to JigSaw"),
    h("p", { class: "muted" },
      "Paste a bearer token: ", h("code", {}, "jigsaw token create --user NAME"),
      " prints one, and ", h("code", {}, "jigsaw dashboard"), " opens this page signed in."),
    form));
  input.focus();
}

async function whoami() {
  const me = await api("/whoami");
  document.getElementById("whoami").textContent = `${me.name}${me.is_admin ? " (admin)" : ""}`;
  document.getElementById("logout").hidden = false;
  return me;
}

document.getElementById("logout").addEventListener("click", () => signIn("Signed out."));
window.addEventListener("hashchange", navigate);
document.addEventListener("visibilitychange", () => { if (!document.hidden && current) refresh(generation); });

takeTokenFromFragment();
if (token()) {
  whoami().then(navigate, (error) => (error instanceof Unauthorized ? signIn("Your token was refused; sign in again.") : navigate()));
} else {
  signIn();
}
