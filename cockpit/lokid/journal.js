/*
 * A preset's journal in its view: the engine unit's lines as journalctl -u
 * loki-engine@NAME shows them, newest last, following.
 *
 * First through journalctl on the server as the logged-in user (cockpit.spawn:
 * the user's own journal rights, as Cockpit's own Logs page reads it). A user
 * the journal does not let read the system's lines (not in adm or
 * systemd-journal: a member of group loki only, say) sees nothing there; for
 * them the daemon's ReadLogs is asked instead, which polkit grants group loki
 * (org.lokid.lokid1.read-logs), every two seconds while the view is open, for
 * the newest lines.
 */
"use strict";

(function () {
    const { el } = lokid;
    const LINES = 200;          // kept on screen: the older ones scroll away
    const FOLLOW_MS = 2000;

    function time(us) {
        const d = new Date(Number(us) / 1000);
        return d.toLocaleTimeString([], { hour12: false }) + "." +
            String(d.getMilliseconds()).padStart(3, "0");
    }

    function mount(box, view) {
        const source = el("p", "lk-muted lk-small", "Reading the journal…");
        source.id = "lk-journal-source";
        const list = el("pre", "lk-journal");
        list.id = "lk-journal";
        const none = el("p", "lk-muted lk-small", "No lines yet: the unit has not run.");
        none.hidden = true;
        const fast = el("p", "lk-muted lk-small",
                        "Lines come faster than this card shows: the newest are kept.");
        fast.hidden = true;
        box.append(source, none, fast, list);
        const unit = "loki-engine@" + view.name + ".service";
        let proc = null;
        let timer = null;
        let gone = false;
        let partial = "";

        function add(entries) {
            const stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
            for (const [us, ident, message] of entries) {
                const line = el("div", "lk-journal-line");
                line.append(el("span", "lk-muted", time(us) + " "),
                            el("span", "lk-journal-ident", (ident || "") + ": "),
                            document.createTextNode(message));
                list.appendChild(line);
            }
            while (list.childElementCount > LINES)
                list.firstElementChild.remove();
            none.hidden = list.childElementCount > 0;
            list.hidden = !none.hidden;
            if (stick)
                list.scrollTop = list.scrollHeight;
        }

        function fromJournalctl(data) {
            const lines = (partial + data).split("\n");
            partial = lines.pop();
            const entries = [];
            for (const text of lines) {
                try {
                    const e = JSON.parse(text);
                    let message = e.MESSAGE;
                    if (Array.isArray(message))      // journalctl gives bytes as numbers
                        message = new TextDecoder().decode(new Uint8Array(message));
                    entries.push([e.__REALTIME_TIMESTAMP, e.SYSLOG_IDENTIFIER || e._COMM,
                        String(message === undefined ? "" : message)]);
                } catch (ex) {
                    // a line cut by the stream is completed by the next chunk
                }
            }
            if (entries.length) {
                source.textContent = "journalctl -u " + unit + ", with your own journal rights";
                add(entries);
            }
        }

        // Each call asks for the unit's last LINES entries and shows those newer than the
        // last one shown: what the card can show, whatever the rate. Following with the
        // cursor read every line in between (250 a second for a busy engine), and cost
        // the daemon a percent of a CPU (benchmarks/cockpit_page.py).
        let newest = -1;
        function readLogs() {
            if (gone)
                return;
            lokid.manager.call("ReadLogs", [view.name, "", LINES])
                    .then(([entries]) => {
                        source.textContent = "lokid's ReadLogs of " + unit +
                            " (your account cannot read the system journal itself)";
                        const fresh = entries.filter(([us]) => Number(us) > newest);
                        if (fresh.length)
                            newest = Number(fresh[fresh.length - 1][0]);
                        fast.hidden = !(fresh.length === LINES && list.childElementCount);
                        add(fresh);
                        timer = window.setTimeout(readLogs, FOLLOW_MS);
                    })
                    .catch(ex => {
                        source.textContent = (lokid.refused(ex) ? "Not permitted: " : "") +
                            "the journal cannot be read: " + lokid.describe(ex);
                    });
        }

        // journalctl -n prints its last lines at once: none means this user sees none
        // of the unit's (or it has none yet; ReadLogs then says so the same way).
        cockpit.spawn(["journalctl", "--unit", unit, "--lines", String(LINES), "--output",
            "json", "--no-pager", "--quiet"], { err: "message" })
                .then(data => {
                    if (gone)
                        return;
                    fromJournalctl(data + "\n");
                    if (!list.childElementCount) {
                        readLogs();
                        return;
                    }
                    proc = cockpit.spawn(["journalctl", "--unit", unit, "--lines", "0",
                        "--follow", "--output", "json", "--quiet"], { err: "message" });
                    proc.stream(fromJournalctl);
                    proc.catch(() => {});
                })
                .catch(() => readLogs());

        return {
            update() {},
            unmount() {
                gone = true;
                if (proc)
                    proc.close();
                if (timer)
                    window.clearTimeout(timer);
            },
        };
    }

    // An external preset has no unit, so no journal.
    lokid.sections.push({ id: "journal", title: "Journal", order: 30, kinds: ["engine", "broken"],
        mount });
}());
