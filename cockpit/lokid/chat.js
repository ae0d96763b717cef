/*
 * "Try it" in a preset's view: a small chat box to the preset's running
 * engine, its reply streaming in as the engine writes it, then the engine's
 * own timings for that reply (prompt and generated tokens and their speed,
 * and the draft acceptance when speculative decoding ran).
 *
 * The request goes through cockpit.http to the engine's port on the server
 * (the bridge runs there as the logged-in user, so it reaches the engine's
 * loopback address as lokictl would): POST /v1/chat/completions with
 * "stream": true, its server-sent events parsed as the chunks arrive, an event
 * cut across two chunks completed by the next. The port is the one the
 * preset's Stats says its engine answers on. A preset whose engine wants an
 * API key (KeyFile) cannot be tried from here: the page never reads the key,
 * and says so rather than failing silently on the engine's 401.
 *
 * The box never goes through the gateway: the page knows neither where it
 * listens (lokid.toml, not the bus) nor a client key it may want. So a stopped
 * on-demand preset can be asked from here only where systemd holds its port
 * (loki-port@NAME.socket: its Argv then has the engine on a UNIX socket, --host
 * /run/loki/NAME.sock): the question's connection starts the engine and waits
 * in the socket's backlog until it is ready. Elsewhere (the local runner, a
 * host that is a name, --host in extra_args) nothing listens on the port while
 * the engine is stopped, and the box says to start it or to ask the gateway.
 *
 * Only the last few turns are sent and kept: a try, not a conversation.
 */
"use strict";

(function () {
    const { el } = lokid;
    const TURNS = 4;                // exchanges kept (each a question and its answer)
    const MAX_TOKENS = 256;         // the reply's default length: the box is a try

    // Where the engine answers, for the bridge on the server: a wildcard address
    // (0.0.0.0, ::) is reached on loopback.
    function endpoint(url) {
        let u;
        try {
            u = new URL(url);
        } catch (ex) {
            return null;
        }
        const host = u.hostname.replace(/^\[|\]$/g, "");
        const wildcard = ["", "0.0.0.0", "::"].includes(host);
        const port = Number(u.port) || (u.protocol === "https:" ? 443 : 80);
        return {
            port,
            address: wildcard ? "127.0.0.1" : host,
            tls: u.protocol === "https:",
            path: u.pathname.replace(/\/+$/, "") + "/v1/chat/completions",
        };
    }

    // systemd holds the port (lokid.core.launch.portunit): the plan puts the engine on a UNIX
    // socket, and the port in Stats' url is the socket unit's, which starts it.
    function portStartsIt(p) {
        const argv = p.Argv || [];
        const at = argv.indexOf("--host");
        return !!p.OnDemand && at >= 0 && /\.sock$/.test(argv[at + 1] || "");
    }

    function timingsText(t) {
        const parts = [];
        if (typeof t.prompt_n === "number")
            parts.push("prompt " + t.prompt_n + " tokens at " +
                       lokid.number(t.prompt_per_second, 1) + " tok/s");
        if (typeof t.predicted_n === "number")
            parts.push("reply " + t.predicted_n + " tokens at " +
                       lokid.number(t.predicted_per_second, 1) + " tok/s");
        if (typeof t.cache_n === "number" && t.cache_n > 0)
            parts.push(t.cache_n + " prompt tokens from the cache");
        if (typeof t.draft_n === "number" && t.draft_n > 0)
            parts.push("draft acceptance " +
                       lokid.number(100 * (t.draft_n_accepted || 0) / t.draft_n, 0) + " % (" +
                       (t.draft_n_accepted || 0) + " of " + t.draft_n + " drafted)");
        return parts.length ? "The engine's timings: " + parts.join(" · ") + "." : "";
    }

    function mount(box, view) {
        const note = el("p", "lk-muted lk-small");
        note.id = "lk-chat-note";
        const log = el("div", "lk-chat-log");
        log.id = "lk-chat-log";
        const prompt = el("textarea", "lk-chat-prompt");
        prompt.id = "lk-chat-prompt";
        prompt.rows = 2;
        prompt.placeholder = "Ask the engine something";
        const max = el("input", "lk-chat-max");
        max.type = "number";
        max.min = "1";
        max.value = String(MAX_TOKENS);
        max.id = "lk-chat-max";
        const maxLabel = el("label", "lk-small", "Max tokens ");
        maxLabel.appendChild(max);
        const send = el("button", "lk-btn lk-btn-secondary", "Send");
        send.type = "button";
        send.id = "lk-chat-send";
        const clear = el("button", "lk-btn lk-btn-secondary", "Clear");
        clear.type = "button";
        clear.id = "lk-chat-clear";
        const row = el("div", "lk-chat-form");
        row.append(prompt, maxLabel, send, clear);
        const timings = el("p", "lk-small");
        timings.id = "lk-chat-timings";
        box.append(note, log, row, timings);

        let messages = [];          // the turns sent with the next question
        let request = null;         // the reply streaming now
        let ready = false;

        function stop() {
            if (request) {
                request.close();
                request = null;
            }
        }

        function keepLast() {
            messages = messages.slice(-2 * TURNS);
            while (log.childElementCount > 2 * TURNS)
                log.firstElementChild.remove();
        }

        function ask() {
            const text = prompt.value.trim();
            const p = view.proxy();
            if (!text || !p || request)
                return;
            const where = endpoint(lokid.stats(p).url || "");
            if (!where) {
                timings.textContent = "lokid does not say where this preset's engine answers.";
                return;
            }
            const mine = el("div", "lk-chat-user", text);
            const reply = el("div", "lk-chat-reply");
            reply.dataset.chunks = "0";
            log.append(mine, reply);
            keepLast();
            prompt.value = "";
            timings.className = "lk-small";
            timings.textContent = p.State === "ready" ? "…"
                : "Starting " + view.name + " for this question (the reply comes once it has loaded)…";
            const sent = messages.concat([{ role: "user", content: text }]);
            const options = { address: where.address };
            if (where.tls)
                options.tls = {};
            const body = JSON.stringify({
                messages: sent,
                stream: true,
                max_tokens: Math.max(1, Math.floor(Number(max.value) || MAX_TOKENS)),
            });
            let pending = "";       // an event not yet ended by its blank line
            let answer = "";
            let last = null;        // the final chunk's timings
            let failure = "";

            function event(lines) {
                const data = lines.filter(l => l.startsWith("data:"))
                        .map(l => l.slice(5).trim()).join("\n");
                if (!data || data === "[DONE]")
                    return;
                let obj;
                try {
                    obj = JSON.parse(data);
                } catch (ex) {
                    return;
                }
                if (obj.error) {
                    failure = obj.error.message || JSON.stringify(obj.error);
                    return;
                }
                const delta = ((obj.choices || [])[0] || {}).delta || {};
                if (typeof delta.content === "string" && delta.content)
                    answer += delta.content;
                if (obj.timings)
                    last = obj.timings;
            }

            const req = cockpit.http(where.port, options).request({
                method: "POST",
                path: where.path,
                body,
                headers: { "Content-Type": "application/json" },
            });
            request = req;
            send.disabled = true;
            req.stream(data => {
                if (request !== req)
                    return;
                const before = answer.length;
                const events = (pending + data).replace(/\r\n/g, "\n").split("\n\n");
                pending = events.pop();
                for (const e of events)
                    event(e.split("\n"));
                if (answer.length > before) {
                    reply.textContent = answer;
                    // How the reply came: in how many pieces, and how long after the first.
                    const chunks = Number(reply.dataset.chunks) + 1;
                    reply.dataset.chunks = String(chunks);
                    if (chunks === 1)
                        reply.dataset.firstLength = String(answer.length);
                    log.scrollTop = log.scrollHeight;
                }
            });
            req.then(() => {
                if (request !== req)
                    return;
                if (pending)
                    event(pending.replace(/\r\n/g, "\n").split("\n"));
                reply.textContent = answer;
                messages = sent.concat([{ role: "assistant", content: answer }]);
                keepLast();
                if (failure) {
                    timings.className = "lk-small lk-error";
                    timings.textContent = "The engine said: " + failure;
                } else {
                    timings.textContent = last ? timingsText(last)
                        : "The engine sent no timings for this reply.";
                }
            }).catch(ex => {
                if (request !== req)
                    return;
                timings.className = "lk-small lk-error";
                if (ex && ex.status === 401) {
                    timings.textContent = "The engine refused the request (401 " +
                        (ex.reason || "Unauthorized") + "): it wants its API key" +
                        (p.KeyFile ? " (from " + p.KeyFile + ")" : "") +
                        ", which this page cannot read. Try it with a client that has the key.";
                } else {
                    timings.textContent = "The engine did not answer: " +
                        (ex && ex.status ? ex.status + " " : "") + lokid.describe(ex);
                }
                reply.remove();
                mine.classList.add("lk-muted");
            }).finally(() => {
                if (request === req) {
                    request = null;
                    reply.dataset.done = "1";
                }
                send.disabled = !ready;
            });
        }

        send.addEventListener("click", ask);
        prompt.addEventListener("keydown", ev => {
            if (ev.key === "Enter" && !ev.shiftKey) {
                ev.preventDefault();
                ask();
            }
        });
        clear.addEventListener("click", () => {
            stop();
            messages = [];
            log.replaceChildren();
            timings.textContent = "";
            send.disabled = !ready;
        });

        return {
            update() {
                const p = view.proxy();
                const external = p && p.Kind === "external";
                const woken = !!p && !external && ["inactive", "loading"].includes(p.State) &&
                    portStartsIt(p);
                ready = !!p && !external && (p.State === "ready" || woken);
                send.disabled = !ready || !!request;
                if (external)
                    note.textContent = "An external API: try it with its own client.";
                else if (woken)
                    note.textContent = "On demand: systemd holds this preset's port (" +
                        (lokid.stats(p).url || "its url") + "), so a question sent from here " +
                        "starts its engine; the reply comes once it has loaded.";
                else if (!ready && p && p.OnDemand)
                    note.textContent = "On demand, but this box talks to the engine's own port, " +
                        "not to the gateway, and nothing listens there while it is stopped: " +
                        "start it, or ask through the gateway, which starts it.";
                else if (!ready)
                    note.textContent = "Start the preset to try it: the box talks to its running engine.";
                else if (p.KeyFile)
                    note.textContent = "This engine wants an API key (from " + p.KeyFile + "); " +
                        "the page cannot read it, so the engine will refuse a question sent from here.";
                else
                    note.textContent = "To " + (lokid.stats(p).url || "the engine") +
                        ", through the server. The last " + TURNS + " turns are sent.";
            },
            unmount: stop,
        };
    }

    lokid.sections.push({ id: "chat", title: "Try it", order: 45, kinds: ["engine", "external"],
        mount });
}());
