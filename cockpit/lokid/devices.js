/*
 * The overview's memory card (issue 29): each device engines take memory from
 * (the manager's Devices: GPUs, then the host) as a bar of its total, with a
 * segment per running preset (its Memory's need there), what other processes
 * hold, the operator's reserve, and what is free; under it, where the figures
 * come from and what could not be read.
 *
 * Documented D-Bus facts only (Devices, each preset's Memory and State),
 * followed through PropertiesChanged like the rest of the overview.
 */
"use strict";

(function () {
    const { manager, $, el, plain, RUNNING } = lokid;

    function gib(bytes) {
        if (typeof bytes !== "number" || !isFinite(bytes))
            return "";
        return bytes >= 2 ** 30 ? (bytes / 2 ** 30).toFixed(1) + " GiB"
            : Math.round(bytes / 2 ** 20) + " MiB";
    }

    function segment(cls, bytes, total, label) {
        const s = el("span", "lk-seg " + cls);
        s.style.width = Math.max(0, Math.min(100, 100 * bytes / total)).toFixed(2) + "%";
        s.title = label + ": " + gib(bytes);
        return s;
    }

    function render() {
        const card = $("lk-devices");
        if (!card || $("lk-overview").hidden)
            return;
        const devices = plain(manager.valid ? manager.Devices || [] : []);
        card.hidden = devices.length === 0;
        const list = $("lk-device-list");
        const running = Object.values(lokid.presets()).filter(p => RUNNING.includes(p.State));
        const rows = [];
        for (const d of devices) {
            const total = d.total || 0;
            const row = el("div", "lk-device");
            row.dataset.device = d.device;
            const bar = el("div", "lk-bar");
            bar.setAttribute("role", "img");
            let lokidBytes = 0;
            for (const p of running) {
                // where its start put it (gpus = "auto": held), else what it needs
                const memory = plain(p.Memory || {});
                const need = (memory.held || memory.needs || {})[d.device];
                if (typeof need === "number" && need > 0 && total > 0) {
                    const seg = segment("lk-seg-preset", need, total, p.Name);
                    seg.dataset.preset = p.Name;
                    seg.textContent = p.Name;
                    bar.appendChild(seg);
                    lokidBytes += need;
                }
            }
            if (total > 0) {
                bar.appendChild(segment("lk-seg-others", d.others || 0, total,
                                        "other processes"));
                bar.appendChild(segment("lk-seg-reserve", d.reserve || 0, total, "reserved"));
            }
            bar.setAttribute("aria-label", d.device + ": " + gib(lokidBytes) + " lokid, " +
                             gib(d.others) + " others, " + gib(d.free) + " free of " +
                             gib(total));
            const head = el("div", "lk-device-head");
            head.append(el("strong", "", d.device + (d.name ? " (" + d.name + ")" : "")),
                        el("span", "lk-muted", gib(total) + ": lokid " + gib(lokidBytes) +
                           ", others " + gib(d.others) + ", reserved " + gib(d.reserve) +
                           ", free " + gib(d.free)));
            row.append(head, bar, el("div", "lk-muted lk-small", "from " + (d.source || "?")));
            for (const note of d.notes || [])
                row.appendChild(el("div", "lk-small lk-note", note));
            rows.push(row);
        }
        list.replaceChildren(...rows);
    }

    lokid.onChange(render);
    lokid.renderDevices = render;
}());
