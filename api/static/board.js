// The live board page (api/pages.py). Everything shown comes from the API and is written as
// text (textContent), never as HTML: a member's name or avatar cannot add markup or script.
"use strict";

const board = decodeURIComponent(location.pathname.replace(/^\/boards\//, ""));
const base = "/v1/boards/" + encodeURIComponent(board);
const $ = (id) => document.getElementById(id);
let windows = [];
let source = null;
let retries = 0; // refusals in a row
let retry = 0; // the timer of the next attempt

function cell(value, cls) {
  const td = document.createElement("td");
  td.textContent = value === undefined || value === null ? "" : String(value);
  if (cls) td.className = cls;
  return td;
}

function avatarCell(meta) {
  const td = cell("", "avatar");
  const avatar = meta && meta.avatar;
  if (typeof avatar === "string" && /^(https:\/\/|data:image\/)/.test(avatar)) {
    const img = document.createElement("img");
    img.alt = "";
    img.referrerPolicy = "no-referrer";
    img.src = avatar; // a property, not markup: the CSP allows https: and data: images only
    td.appendChild(img);
  } else if (typeof avatar === "string") {
    td.textContent = avatar.slice(0, 4); // an emoji, say: text
  }
  return td;
}

function trendCell(item) {
  const td = cell("", "trend");
  if (!("prev_rank" in item)) return td;
  if (item.prev_rank === null) {
    td.textContent = "new";
    td.classList.add("new");
  } else if (item.prev_rank > item.rank) {
    td.textContent = "▲ " + (item.prev_rank - item.rank);
    td.classList.add("up");
  } else if (item.prev_rank < item.rank) {
    td.textContent = "▼ " + (item.rank - item.prev_rank);
    td.classList.add("down");
  } else {
    td.textContent = "=";
  }
  return td;
}

function row(item, mine) {
  const tr = document.createElement("tr");
  tr.className = mine ? "row me" : "row";
  tr.dataset.member = item.member;
  const meta = item.meta && typeof item.meta === "object" ? item.meta : {};
  tr.append(
    cell(item.rank, "rank"),
    trendCell(item),
    avatarCell(meta),
    cell(typeof meta.name === "string" ? meta.name : "", "name"),
    cell(item.member, "member"),
    cell(item.score, "score"),
  );
  return tr;
}

function fill(table, items, mine) {
  table.tBodies[0].replaceChildren(...items.map((item) => row(item, item.member === mine)));
}

function selected() {
  const name = $("window").value;
  const query = new URLSearchParams({ window: name, limit: $("limit").value });
  const period = $("period").value;
  if (period) query.set("period", period);
  const found = windows.find((w) => w.name === name);
  if (found && found.trend) query.set("trend", "1");
  return query;
}

function problem(text) {
  $("problem").hidden = !text;
  $("problem").textContent = text || "";
}

function connect() {
  clearTimeout(retry);
  if (source) source.close();
  const query = selected();
  history.replaceState(null, "", location.pathname + "?" + query.toString());
  $("status").textContent = "connecting…";
  $("status").classList.remove("live");
  source = new EventSource(base + "/events?" + query.toString());
  source.addEventListener("top", (event) => {
    retries = 0;
    const top = JSON.parse(event.data);
    problem("");
    fill($("top"), top.items, $("member").value);
    $("summary").textContent =
      `${top.total} members · window ${top.window} · period ${top.period} · from ${top.source} · seq ${top.seq}`;
    $("status").textContent = "live · updated " + new Date().toLocaleTimeString();
    $("status").classList.add("live");
    $("top").dataset.seq = String(top.seq);
  });
  source.addEventListener("unavailable", (event) => {
    const error = JSON.parse(event.data).error;
    problem(`${error.code}: ${error.message}`);
  });
  source.onerror = () => {
    $("status").classList.remove("live");
    if (source.readyState !== EventSource.CLOSED) {
      $("status").textContent = "reconnecting…"; // the browser retries by itself
      return;
    }
    // refused (a node at its most streams, stopping, a rate limit, an expired token): a browser
    // does not retry that by itself; ask again later, each time a little later
    retries += 1;
    const wait = Math.min(30, 2 ** retries);
    $("status").textContent = `disconnected by the server; retrying in ${wait} s`;
    clearTimeout(retry);
    retry = setTimeout(connect, wait * 1000);
  };
}

function periods() {
  const found = windows.find((w) => w.name === $("window").value);
  const options = [new Option("current", "")];
  for (const id of found ? found.periods : []) options.push(new Option(id, id));
  $("period").replaceChildren(...options);
  $("period").disabled = !found || found.periods.length === 0;
}

async function get(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(`${body.error.code}: ${body.error.message}`);
  return body;
}

async function search(event) {
  event.preventDefault();
  const member = $("member").value;
  const query = selected();
  query.delete("limit");
  const path = base + "/members/" + encodeURIComponent(member);
  try {
    const found = await get(path + "?" + query.toString());
    $("found").textContent = `${found.member}: rank ${found.rank}, score ${found.score}`;
    query.set("n", "5");
    const around = await get(path + "/around?" + query.toString());
    fill($("around"), around.items, member);
    $("around").hidden = false;
  } catch (error) {
    $("found").textContent = String(error.message);
    $("around").hidden = true;
  }
}

async function start() {
  $("board").textContent = board;
  document.title = board + " · rankstream";
  const wanted = new URLSearchParams(location.search);
  try {
    const described = await get(base);
    windows = described.windows.filter((w) => !w.league); // a league's season is read by division
  } catch (error) {
    problem(String(error.message));
    return;
  }
  $("window").replaceChildren(...windows.map((w) => new Option(w.name, w.name)));
  if (windows.some((w) => w.name === wanted.get("window"))) $("window").value = wanted.get("window");
  periods();
  if (wanted.get("period")) $("period").value = wanted.get("period");
  if (["10", "25", "50", "100"].includes(wanted.get("limit"))) $("limit").value = wanted.get("limit");
  $("window").addEventListener("change", () => {
    periods();
    connect();
  });
  $("period").addEventListener("change", connect);
  $("limit").addEventListener("change", connect);
  $("search").addEventListener("submit", search);
  connect();
}

start();
