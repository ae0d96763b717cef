/*
 * The overview's usage card (issue 46, item 2): one line per key of the gateway,
 * with its requests, tokens (prompt + generated, the engines' own figures) and
 * refusals today and this month (UTC), as lokictl usage counts them.
 *
 * Read with the documented Usage method of org.lokid.Lokid1.Usage (anyone may call
 * it) when the overview opens, and again at most twice a minute while the presets'
 * properties change (requests served move their Stats): Usage has no change signal,
 * and the page never polls on a timer, so an idle page asks nothing. The card
 * stays hidden while nothing is counted, and where the method is missing (an older
 * lokid) or refused: usage is extra to the overview, never an alert.
 */
"use strict";

(function () {
    const { client, $, el, plain } = lokid;
    const USAGE = "org.lokid.Lokid1.Usage";
    const PATH = "/org/lokid/Lokid1";
    const EVERY_MS = 30000;
    let asking = false;

    function ask(since) {
        const query = { since: { t: "s", v: since }, by: { t: "as", v: ["key"] } };
        return client.call(PATH, USAGE, "Usage", [query])
                .then(([rows]) => plain(rows));
    }

    function count(n) {
        return typeof n === "number" ? n.toLocaleString() : "0";
    }

    function tokens(row) {
        return row ? (row.prompt_tokens || 0) + (row.generated_tokens || 0) : 0;
    }

    function cells(tr, row) {
        tr.appendChild(el("td", "lk-num", count(row ? row.requests : 0)));
        tr.appendChild(el("td", "lk-num", count(tokens(row))));
        tr.appendChild(el("td", "lk-num", count(row ? row.refused : 0)));
    }

    function draw(today, month) {
        const card = $("lk-usage");
        const body = $("lk-usage-rows");
        const byKey = {};
        for (const r of today)
            byKey[r.key] = r;
        body.textContent = "";
        for (const m of month) {
            const tr = el("tr");
            tr.dataset.key = m.key;
            tr.appendChild(el("th", "", m.key)).setAttribute("scope", "row");
            cells(tr, byKey[m.key]);
            cells(tr, m);
            body.appendChild(tr);
        }
        card.hidden = month.length === 0 || !onOverview();
    }

    // the overview's: hidden on a preset's view (#/preset/NAME)
    function onOverview() {
        return cockpit.location.path[0] !== "preset";
    }

    function refresh() {
        const card = $("lk-usage");
        if (!card)
            return;
        if (!onOverview()) {
            card.hidden = true;
            return;
        }
        if (asking)
            return;
        const now = new Date();
        const day = now.toISOString().slice(0, 10);
        asking = true;
        Promise.all([ask(day), ask(day.slice(0, 8) + "01")])
                .then(([today, month]) => draw(today, month))
                .catch(() => { card.hidden = true })
                .finally(() => { asking = false });
    }

    // at most one question per EVERY_MS while the presets' properties change
    let last = 0;
    let later = null;
    function followed() {
        if (later !== null)
            return;
        later = window.setTimeout(() => {
            later = null;
            last = performance.now();
            refresh();
        }, Math.max(0, last + EVERY_MS - performance.now()));
    }

    lokid.renderUsage = refresh;
    lokid.onChange(followed);
    cockpit.addEventListener("locationchanged", refresh);
    last = performance.now();
    refresh();
}());
