/*
 * The overview's waiting requests card (issue 46, item 4): who waits in the gateway,
 * where and why (a preset's slots busy, its engine loading, a swap, the placement's
 * wait for memory), per preset, key and class, as lokictl top shows it.
 *
 * Read from the Queues property of org.lokid.Lokid1.Usage (anyone may read it), which
 * the gateway's reports keep (lokid.gateway.waiting); followed by its PropertiesChanged,
 * sent when a count or a why changes. The oldest wait grows here, drawn again each
 * second from the age the daemon gave and the time it was read, while anything waits:
 * no bus call on a timer. The card is made here (index.html only loads this file),
 * stays hidden while nothing waits, on a preset's view, and where the property is
 * missing (an older lokid).
 */
"use strict";

(function () {
    const { client, $, el, plain } = lokid;
    const proxy = client.proxy("org.lokid.Lokid1.Usage", "/org/lokid/Lokid1");
    let rows = [];
    let readAt = 0;
    let ticking = null;

    function card() {
        let c = $("lk-queues");
        if (c)
            return c;
        c = el("section", "lk-card");
        c.id = "lk-queues";
        c.hidden = true;
        c.setAttribute("aria-labelledby", "lk-queues-title");
        const title = c.appendChild(el("h2", "lk-card-title", "Waiting requests"));
        title.id = "lk-queues-title";
        const table = c.appendChild(el("div", "lk-table-wrap")).appendChild(el("table", "lk-table"));
        const head = table.appendChild(el("thead")).appendChild(el("tr"));
        for (const name of ["Preset", "Key", "Class", "Waiting", "Oldest", "Why"])
            head.appendChild(el("th", "", name)).setAttribute("scope", "col");
        table.appendChild(el("tbody")).id = "lk-queues-rows";
        const usage = $("lk-usage");
        if (usage && usage.parentNode)
            usage.parentNode.insertBefore(c, usage);
        else
            document.body.appendChild(c);
        return c;
    }

    function draw() {
        const c = card();
        const body = $("lk-queues-rows");
        const grown = (performance.now() - readAt) / 1000;
        body.textContent = "";
        for (const r of rows) {
            const tr = body.appendChild(el("tr"));
            tr.dataset.preset = r.preset;
            tr.dataset.key = r.key;
            tr.appendChild(el("th", "", r.preset)).setAttribute("scope", "row");
            tr.appendChild(el("td", "", r.key));
            tr.appendChild(el("td", "", r.class));
            tr.appendChild(el("td", "lk-num", String(r.waiting)));
            tr.appendChild(el("td", "lk-num", Math.round((r.oldest_s || 0) + grown) + " s"));
            tr.appendChild(el("td", "", r.why));
        }
        c.hidden = rows.length === 0 || cockpit.location.path[0] === "preset";
        // the oldest wait grows here each second while rows are shown (one timer, set
        // again by each drawing; the bus is never asked on a timer)
        if (ticking !== null) {
            window.clearTimeout(ticking);
            ticking = null;
        }
        if (!c.hidden) {
            ticking = window.setTimeout(function () { ticking = null; draw(); }, 1000);
        }
    }

    function read() {
        const q = proxy.valid ? proxy.data.Queues : undefined;
        rows = Array.isArray(q) ? plain(q) : [];
        readAt = performance.now();
        draw();
    }

    proxy.addEventListener("changed", read);
    proxy.wait(read);
    cockpit.addEventListener("locationchanged", draw);
}());
