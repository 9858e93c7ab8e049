// The report's only script (eval/view.py inlines it and allows it by its hash). It builds the claim tables
// from the page's JSON and renders a claim's debate from that claim's own JSON block when it is opened.
// Everything a run recorded is put in the page as text nodes (never as markup), so model text stays text.
"use strict";
(function () {
  const runs = JSON.parse(document.getElementById("runs-data").textContent);
  const NO_VERDICT = "no verdict";
  const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
                  "#ccb974", "#64b5cd"];
  const tables = [];
  let current = null; // {r, i} of the debate shown

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child)); // a string becomes a text node
    }
    return node;
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "-";
    if (typeof value !== "number" || !isFinite(value)) return String(value);
    return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(digits === undefined ? 3 : digits);
  }

  function labelText(label) {
    return label === null || label === undefined ? NO_VERDICT : String(label);
  }

  function colorOf(labels, label) {
    const k = labels.indexOf(label);
    return k < 0 ? "#bbbbbb" : COLORS[k % COLORS.length];
  }

  function probBar(labels, probs) {
    const keys = labels.concat(Object.keys(probs).filter((k) => !labels.includes(k)));
    const bar = el("span", {class: "pbar", title: keys.map((k) => `${k} ${num(probs[k])}`).join(", ")});
    for (const key of keys) {
      const part = el("span");
      part.style.width = `${Math.max(0, Math.min(1, Number(probs[key]) || 0)) * 100}%`;
      part.style.background = colorOf(labels, key);
      bar.append(part);
    }
    return bar;
  }

  // ------------------------------------------------------------ the claim tables

  const COLUMNS = [
    ["id", "claim id"], ["claim", "claim"], ["gold", "gold"], ["pred", "predicted"], ["p", "probabilities"],
    ["rounds", "rounds"], ["stop", "stop"], ["tokens", "tokens"], ["correct", "correct"],
  ];

  function compare(a, b) {
    if (a === b) return 0;
    if (a === null || a === undefined) return 1; // unknown values sort last either way
    if (b === null || b === undefined) return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), "en", {numeric: true});
  }

  function buildTable(r) {
    const run = runs[r];
    const host = document.querySelector(`.claims[data-run="${r}"]`);
    const labels = run.labels;
    const hasGold = run.rows.some((row) => row.gold !== null && row.gold !== undefined);
    const search = el("input", {type: "search", class: "search", placeholder: "claim text or id",
      "aria-label": "filter by text"});
    const wrong = el("input", {type: "checkbox", class: "wrong", disabled: !hasGold});
    const options = (values) => [el("option", {value: ""}, "any")]
      .concat(values.map((v) => el("option", {value: v}, v)));
    const predicted = labels.concat(run.rows.some((row) => !labels.includes(row.pred)) ? [NO_VERDICT] : []);
    const gold = el("select", {class: "gold", disabled: !hasGold}, options(labels));
    const pred = el("select", {class: "pred"}, options(predicted));
    const stops = Array.from(new Set(run.rows.map((row) => row.stop).filter((s) => s !== null && s !== undefined)))
      .map(String);
    const stop = el("select", {class: "stop", disabled: !stops.length}, options(stops.sort()));
    const count = el("p", {class: "count", role: "status"});
    const legend = el("p", {class: "legend"}, labels.map((label) => el("span", {},
      el("i", {class: "swatch", style: null}), label)));
    legend.querySelectorAll("i").forEach((swatch, k) => { swatch.style.background = colorOf(labels, labels[k]); });
    const body = el("tbody");
    const items = run.rows.map((row) => ({row, tr: trOf(r, row, labels),
      text: `${row.id} ${row.claim}`.toLowerCase()}));
    const head = el("tr", {}, COLUMNS.map(([key, name]) => el("th", {},
      el("button", {type: "button", "data-key": key, onclick: () => sortBy(key)}, name))));
    let order = items.slice();
    let sorted = {key: null, dir: 1};

    function apply() {
      const text = search.value.trim().toLowerCase();
      let shown = 0;
      for (const item of items) {
        const row = item.row;
        const visible = (!text || item.text.includes(text)) && (!wrong.checked || row.correct === false) &&
          (!gold.value || row.gold === gold.value) && (!pred.value || labelText(row.pred) === pred.value) &&
          (!stop.value || String(row.stop) === stop.value);
        item.tr.hidden = !visible;
        shown += visible;
      }
      count.textContent = `Showing ${shown} of ${items.length} claims`;
    }

    function sortBy(key) {
      sorted = {key, dir: sorted.key === key ? -sorted.dir : 1};
      const value = key === "pred" || key === "gold" ? (row) => row[key] ?? null : (row) => row[key];
      order = items.slice().sort((a, b) => {
        const va = value(a.row), vb = value(b.row);
        if (va === null || va === undefined || vb === null || vb === undefined) return compare(va, vb);
        return sorted.dir * compare(va, vb);
      });
      body.append(...order.map((item) => item.tr));
      head.querySelectorAll("button").forEach((b) => {
        b.dataset.sorted = b.dataset.key === key ? (sorted.dir > 0 ? "asc" : "desc") : "";
      });
    }

    for (const input of [search, wrong, gold, pred, stop]) input.addEventListener("input", apply);
    body.append(...items.map((item) => item.tr));
    host.append(
      el("div", {class: "filters"},
        el("label", {}, "text ", search), el("label", {}, wrong, " wrong only"),
        el("label", {}, "gold ", gold), el("label", {}, "predicted ", pred), el("label", {}, "stop ", stop)),
      count, labels.length ? legend : null, el("table", {class: "claim-table"}, el("thead", {}, head), body));
    apply();
    return {visible: () => order.filter((item) => !item.tr.hidden).map((item) => item.row.i),
            rowOf: (i) => items[i] && items[i].tr};
  }

  function trOf(r, row, labels) {
    const correct = row.correct === null || row.correct === undefined ? "-" : row.correct ? "yes" : "no";
    const probs = row.probs ? [probBar(labels, row.probs), " ", num(row.p, 2)] : "-";
    return el("tr", {class: row.correct === false ? "wrong" : row.correct ? "right" : null},
      el("td", {class: "mono"}, row.id),
      el("td", {class: "claim"}, el("a", {href: `#r${r}-c${row.i}`}, row.claim || "(no claim text)")),
      el("td", {}, row.gold ?? "-"),
      el("td", {}, labelText(row.pred)), el("td", {class: "probs"}, probs), el("td", {}, num(row.rounds)),
      el("td", {}, row.stop === null || row.stop === undefined ? "-" : String(row.stop)),
      el("td", {}, num(row.tokens)), el("td", {}, correct));
  }

  // ------------------------------------------------------------ one debate

  // Prediction fields the debate view lays out itself; every other field is listed as it was recorded.
  const SHOWN = new Set(["claim_id", "label", "gold_label", "gold", "justification", "justification_unrefined",
    "parse_status", "label_probs", "rounds", "stop_reason", "prompt_tokens", "encoded_tokens", "completion_tokens",
    "madr", "votes", "vote_probs", "vote_counts", "tie", "confidence", "confidence_parts", "panel_verdict",
    "decided_by", "panel", "hearings", "evidence"]);
  const SIDE = {affirmative: "pro", plaintiff: "pro", negative: "con", defense: "con", user: "pro",
    assistant: "con"};

  function value(v) {
    if (v === null || v === undefined) return el("span", {class: "muted"}, "-");
    if (typeof v === "string") return el("div", {class: "text"}, v);
    if (typeof v !== "object") return el("span", {}, String(v));
    return el("pre", {}, JSON.stringify(v, null, 2));
  }

  function facts(pairs) {
    return el("dl", {class: "facts"}, pairs.filter(([, v]) => v !== undefined).map(([k, v]) =>
      [el("dt", {}, k), el("dd", {}, v instanceof Node ? v : value(v))]));
  }

  function probsTable(labels, probs) {
    const keys = labels.concat(Object.keys(probs).filter((k) => !labels.includes(k)));
    const top = Math.max(...keys.map((k) => Number(probs[k]) || 0));
    return el("table", {class: "probs-table"}, el("tbody", {}, keys.filter((k) => k in probs).map((k) => {
      const bar = el("span", {class: "pfill"});
      bar.style.width = `${(Number(probs[k]) || 0) * 100}%`;
      return el("tr", {class: (Number(probs[k]) || 0) === top ? "top" : null},
        el("td", {}, k), el("td", {class: "mono"}, num(probs[k])), el("td", {class: "barcell"}, bar));
    })));
  }

  function evidenceList(items) {
    if (!items || !items.length) return el("p", {class: "muted"}, "No evidence recorded for this claim.");
    return el("ol", {class: "evidence"}, items.map((item) => {
      if (typeof item !== "object" || item === null) return el("li", {}, value(item));
      const known = ["question", "answer", "text", "url", "passage"];
      const rest = Object.fromEntries(Object.entries(item).filter(([k]) => !known.includes(k)));
      const passage = item.passage && typeof item.passage === "object" ? item.passage : null;
      return el("li", {},
        item.question ? el("div", {}, el("b", {}, "Q "), item.question) : null,
        item.answer ? el("div", {}, el("b", {}, "A "), item.answer) : null,
        item.text ? el("div", {class: "text"}, item.text) : null,
        passage ? value(passage.text || passage) : null,
        item.url ? el("div", {class: "url"}, item.url) : null, // a source address as text: nothing to follow
        Object.keys(rest).length ? el("div", {class: "muted"}, JSON.stringify(rest)) : null);
    }));
  }

  function turnView(t, k, labels) {
    const role = String(t.role ?? "?");
    const badges = [["parse_status", "status"], ["schema", "schema"]]
      .filter(([key]) => t[key] !== undefined && t[key] !== null)
      .map(([key, name]) => el("span", {class: "badge"}, `${name}: ${t[key]}`));
    const probs = t.probs && typeof t.probs === "object" ? Object.entries(t.probs).map(([field, dist]) =>
      el("div", {class: "choice"}, el("b", {}, field),
        dist && typeof dist === "object" ? probsTable(labels, dist) : value(dist))) : [];
    const extra = Object.fromEntries(Object.entries(t).filter(([key]) =>
      !["round", "role", "prompt", "response", "parse_status", "schema", "probs"].includes(key)));
    const turn = el("div", {class: `turn ${SIDE[role] || (role.startsWith("madr") ? "madr" : "")}`},
      el("div", {class: "turn-head"}, el("span", {class: "round"}, `#${k + 1} · round ${t.round ?? "-"}`), " ",
        el("b", {}, role), " ", badges),
      value(t.response ?? ""), probs.length ? el("div", {class: "choices"}, probs) : null,
      Object.keys(extra).length ? facts(Object.entries(extra)) : null);
    if (typeof t.prompt === "string") {
      const size = t.prompt.length.toLocaleString("en");
      const details = el("details", {}, el("summary", {}, `prompt (${size} characters)`));
      // Filled when first opened: most prompts are never read, and they are most of a transcript.
      details.addEventListener("toggle", () => {
        if (details.open && details.childElementCount === 1) details.append(value(t.prompt));
      });
      turn.append(details);
    }
    return turn;
  }

  function panelView(p) {
    const parts = [];
    if (Array.isArray(p.votes)) {
      const probs = p.vote_probs && typeof p.vote_probs === "object" ? Object.values(p.vote_probs) : [];
      const seats = p.votes.map((vote, s) => el("tr", {},
        el("td", {}, `${"confidence" in p ? "judge" : "voter"} ${s + 1}`), el("td", {}, labelText(vote)),
        el("td", {}, probs[s] && typeof probs[s] === "object" ? probsTable(Object.keys(probs[s]), probs[s]) : "-")));
      parts.push(el("table", {class: "votes"}, el("thead", {}, el("tr", {}, el("th", {}, "seat"), el("th", {}, "vote"),
        el("th", {}, "vote probabilities"))), el("tbody", {}, seats)));
    }
    const pairs = [["vote counts", p.vote_counts], ["tie", p.tie], ["panel verdict", p.panel_verdict],
      ["decided by", p.decided_by], ["confidence", p.confidence], ["confidence parts", p.confidence_parts],
      ["panel", p.panel && p.panel.note !== undefined ? p.panel.note : p.panel]].filter(([, v]) => v !== undefined);
    if (pairs.length) parts.push(facts(pairs));
    if (Array.isArray(p.hearings)) {
      const head = ["hearing", "rounds", "stop reason", "P-RAG criteria", "discovered", "reflection totals"];
      const criteria = (h) => (h.prag_criteria || []).map((c, r) => c ? `round ${r + 1}: ${c}` : null)
        .filter(Boolean).join(", ") || "-";
      const row = (h, k) => el("tr", {}, el("td", {}, k ? "role-switched" : "first"), el("td", {}, num(h.rounds)),
        el("td", {}, String(h.stop_reason ?? "-")), el("td", {}, criteria(h)),
        el("td", {}, num(h.discovered)),
        el("td", {}, (h.reflection_totals || []).map((x) => num(x, 2)).join(", ") || "-"));
      parts.push(el("h4", {}, "Hearings"), el("table", {class: "votes"},
        el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))), el("tbody", {}, p.hearings.map(row))));
      p.hearings.forEach((h, k) => {
        if (Array.isArray(h.queries) && h.queries.length) {
          const which = k ? "role-switched" : "first";
          const query = (q) => el("tr", {}, el("td", {}, `round ${q.round ?? "-"}`),
            el("td", {}, String(q.side ?? "-")), el("td", {}, value(q.query)),
            el("td", {}, `${num(q.admitted)} of ${num(q.retrieved)} admitted`));
          parts.push(el("details", {}, el("summary", {}, `P-RAG queries of the ${which} hearing (${h.queries.length})`),
            el("table", {class: "votes"}, el("tbody", {}, h.queries.map(query)))));
        }
      });
    }
    if (!parts.length) return null;
    return el("section", {}, el("h3", {}, "votes" in p && "confidence" in p ? "Panel" : "Votes"), parts);
  }

  // --debate-retrieval: per round, each side's query, what came back and what was decided on each passage.
  function growthView(g) {
    if (!g || typeof g !== "object" || !Array.isArray(g.rounds)) return null;
    const rows = [];
    g.rounds.forEach((round) => (round.queries || []).forEach((q) => {
      const returned = q.returned || [];
      const passages = returned.length ? el("ol", {class: "evidence"}, returned.map((p) => el("li", {},
        el("span", {class: "badge"}, String(p.decision ?? "-")), " ",
        el("span", {class: "muted"}, `novelty ${num(p.novelty, 2)} · score ${num(p.score, 2)}`),
        value(p.text), p.url ? el("div", {class: "url"}, p.url) : null)))
        : el("span", {class: "muted"}, "nothing came back");
      rows.push(el("tr", {}, el("td", {}, `round ${round.round ?? "-"}`), el("td", {}, String(q.side ?? "-")),
        el("td", {}, value(q.query), q.cut ? el("span", {class: "muted"}, "(cut to the word cap)") : null),
        el("td", {}, passages), el("td", {}, num(round.evidence_size))));
    }));
    const limits = g.limits ? Object.entries(g.limits).map(([k, v]) => `${k} ${v}`).join(", ") : "-";
    return el("section", {}, el("h3", {}, "Retrieval during the debate"),
      facts([["source", g.source], ["limits", limits]]),
      el("table", {class: "votes"}, el("thead", {}, el("tr", {}, ["round", "side", "query",
        "passages returned (decision)", "evidence after the round"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
  }

  function debateView(r, d) {
    const run = runs[r];
    const p = d.prediction || {};
    const gold = p.gold_label !== undefined ? p.gold_label : p.gold;
    const labels = run.labels;
    const right = gold === null || gold === undefined || !("label" in p) ? "-" : p.label === gold ? "yes" : "no";
    const verdict = facts([["predicted", labelText(p.label)], ["gold", gold ?? "-"], ["correct", right],
      ["parse status", p.parse_status], ["stop reason", p.stop_reason], ["rounds", p.rounds],
      ["tokens (prompt / encoded / completion)",
        [p.prompt_tokens, p.encoded_tokens, p.completion_tokens].map((x) => num(x)).join(" / ")]]);
    const probs = p.label_probs && typeof p.label_probs === "object"
      ? [el("h4", {}, "Label probabilities"), probsTable(labels, p.label_probs)] : null;
    const justification = "justification_unrefined" in p
      ? [el("h3", {}, "Justification, refined by MADR"), value(p.justification),
         el("h3", {}, "Justification before refinement"), value(p.justification_unrefined),
         p.madr ? facts(Object.entries(p.madr)) : null]
      : [el("h3", {}, "Justification"), value(p.justification)];
    const other = Object.entries(p).filter(([key]) => !SHOWN.has(key));
    const recorded = Object.entries(d.transcript || {}).filter(([key]) => key !== "debate_retrieval");
    return el("article", {class: "debate"},
      el("p", {class: "muted"}, `${run.name}: claim ${d.id}`),
      el("h2", {class: "text"}, d.claim || "(no claim text)"),
      el("section", {class: `verdict ${right === "no" ? "wrong" : right === "yes" ? "right" : ""}`},
        el("h3", {}, "Verdict"), verdict, probs),
      el("section", {}, justification),
      panelView(p),
      growthView((d.transcript || {}).debate_retrieval),
      el("section", {}, el("h3", {}, `Evidence (${(d.evidence || []).length})`), evidenceList(d.evidence)),
      el("section", {}, el("h3", {}, `Debate (${(d.turns || []).length} turns)`),
        (d.turns || []).map((t, k) => turnView(t, k, labels))),
      other.length || recorded.length
        ? el("section", {}, el("h3", {}, "Other fields"), facts(other.concat(recorded))) : null);
  }

  // ------------------------------------------------------------ tabs, the debate panel, the address

  const panel = document.getElementById("debate");
  const panelBody = document.getElementById("debate-body");

  function showTab(id) {
    let found = false;
    for (const section of document.querySelectorAll("section.tab")) {
      section.hidden = section.id !== id;
      found = found || section.id === id;
    }
    for (const button of document.querySelectorAll("#tabs button")) {
      button.setAttribute("aria-selected", String(button.dataset.tab === id));
    }
    return found;
  }

  function openDebate(r, i) {
    const block = document.getElementById(`d${r}-${i}`);
    if (!block) return false;
    panelBody.replaceChildren(debateView(r, JSON.parse(block.textContent)));
    const before = current && tables[current.r].rowOf(current.i);
    if (before) before.classList.remove("open");
    current = {r, i};
    const tr = tables[r].rowOf(i);
    if (tr) tr.classList.add("open");
    panel.hidden = false;
    panel.scrollTop = 0;
    return true;
  }

  function route() {
    const hash = decodeURIComponent(location.hash.slice(1));
    const claim = /^r(\d+)-c(\d+)$/.exec(hash);
    if (claim && showTab(`tab-r${claim[1]}`) && openDebate(Number(claim[1]), Number(claim[2]))) return;
    panel.hidden = true;
    if (!(hash && showTab(hash))) showTab(document.querySelector("#tabs button").dataset.tab);
  }

  function step(delta) {
    if (!current) return;
    const order = tables[current.r].visible();
    const at = order.indexOf(current.i);
    const next = order[at < 0 ? 0 : at + delta];
    if (next !== undefined) location.hash = `r${current.r}-c${next}`;
  }

  function close() {
    if (current) location.hash = `tab-r${current.r}`;
  }

  runs.forEach((_, r) => tables.push(buildTable(r)));
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => { location.hash = button.dataset.tab; });
  }
  document.getElementById("close").addEventListener("click", close);
  document.getElementById("prev").addEventListener("click", () => step(-1));
  document.getElementById("next").addEventListener("click", () => step(1));
  document.addEventListener("keydown", (event) => { if (event.key === "Escape" && !panel.hidden) close(); });
  window.addEventListener("hashchange", route);
  route();
})();
