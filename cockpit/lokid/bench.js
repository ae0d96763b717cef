/*
 * The benchmark of a preset's view: Run calls the daemon's Bench (quick or
 * full, the predicted and prompt tokens asked, filled in with the daemon's
 * defaults, 300 and 2000; an empty box sends 0, which means the same),
 * its progress comes live from the BenchProgress signal (the phase and a bar
 * of step over steps), then the outcome's figures in a small table, and beside
 * it the stored result of this very configuration (the LastBench property,
 * followed through PropertiesChanged).
 *
 * The daemon decides everything: a refusal (polkit), a preset that is not
 * ready, a benchmark already running are its own words, shown as they come.
 * Bench answers only when the benchmark ends (minutes in full mode), so the
 * call gets a long timeout of its own rather than the bus's default.
 */
"use strict";

(function () {
    const { el } = lokid;
    // Full mode is at most a warm-up, the short line, a cold prefill and three turns,
    // each cut by the daemon at 360 s: two hours covers it with room.
    const BENCH_TIMEOUT_MS = 2 * 3600 * 1000;

    // A reply's a{sv} as plain values, all the way down (result, draft, depth).
    const plain = lokid.plain;

    function rate(draft) {
        if (!draft || !draft.n)
            return "";
        return lokid.number(100 * draft.accepted / draft.n, 0) + " % (" + draft.accepted +
            " of " + draft.n + " drafted)";
    }

    function seconds(ms) {
        return typeof ms === "number" ? lokid.number(ms / 1000, 2) + " s" : "";
    }

    // [label, value, detail] rows of a result, each only when the engine gave it.
    function figures(r) {
        const rows = [];
        const add = (label, value, detail) => {
            if (value !== "" && value !== undefined && value !== null)
                rows.push([label, value, detail || ""]);
        };
        add("Mode", r.mode);
        add("Prefill", r.prompt_per_second !== undefined
            ? lokid.number(r.prompt_per_second, 1) + " tok/s" : "",
            r.prompt_n !== undefined ? r.prompt_n + " tokens in " + seconds(r.prompt_ms) : "");
        add("Decode", r.predicted_per_second !== undefined
            ? lokid.number(r.predicted_per_second, 1) + " tok/s" : "",
            r.predicted_n !== undefined ? r.predicted_n + " tokens in " + seconds(r.predicted_ms) : "");
        add("Draft acceptance", rate(r.draft));
        const d = r.depth;
        if (d && d.skipped) {
            add("Depth", "skipped", d.skipped);
        } else if (d) {
            if (d.cold)
                add("Prefill at depth", lokid.number(d.cold.prompt_per_second, 1) + " tok/s",
                    d.cold.new + " tokens, cold");
            if (typeof d.cached_per_second === "number")
                add("Prefill, cache reused", lokid.number(d.cached_per_second, 1) + " tok/s",
                    "the new tokens of each turn");
            if (typeof d.decode_per_second === "number")
                add("Decode at depth", lokid.number(d.decode_per_second, 1) + " tok/s",
                    rate(d.draft));
            add("Cache reuse", typeof d.reuse === "number" ? lokid.number(100 * d.reuse, 0) + " %"
                : "n/a", d.reuse_note);
            if (d.partial)
                add("Depth", "partial", d.partial);
            if (d.hint)
                add("Hint", "possible thrash", d.hint);
        }
        if (r.slot_note || typeof r.slot === "number")
            add("Slot", typeof r.slot === "number" ? r.slot + (r.slots ? " of " + r.slots : "")
                : "the engine's choice", r.slot_note);
        add("KV cache", r.kv, r.kv_quantized ? "quantized: a grey zone against lossless caches" : "");
        add("Engine", r.engine);
        add("Total", typeof r.elapsed === "number" ? lokid.number(r.elapsed, 2) + " s" : "");
        return rows;
    }

    function table(r, id) {
        const t = el("table", "lk-table lk-bench-table");
        t.id = id;
        const body = el("tbody");
        for (const [label, value, detail] of figures(r)) {
            const tr = el("tr");
            tr.append(el("th", "", label), el("td", "lk-bench-value", String(value)),
                      el("td", "lk-muted lk-small", detail));
            body.appendChild(tr);
        }
        t.appendChild(body);
        return t;
    }

    function mount(box, view) {
        const form = el("div", "lk-bench-form");
        const mode = el("select");
        mode.id = "lk-bench-mode";
        for (const [value, label] of [["quick", "Quick: a warm-up, then one short line"],
            ["full", "Full: plus a cold prefill at depth and three turns"]]) {
            const o = el("option", "", label);
            o.value = value;
            mode.appendChild(o);
        }
        // The daemon's defaults (lokid.core.bench.rules: DEFAULT_PREDICT, DEFAULT_PROMPT;
        // lokictl bench's too) written in, so the form shows what a run measures; an
        // emptied box still asks for them (0 on the bus).
        const number = (id, label, value) => {
            const input = el("input");
            input.type = "number";
            input.min = "1";
            input.max = "131072";
            input.value = String(value);
            input.id = id;
            input.title = "Empty: the daemon's default, " + value;
            const l = el("label", "lk-small", label + " ");
            l.appendChild(input);
            return [l, input];
        };
        const [predictLabel, predict] = number("lk-bench-predict", "Generated tokens", 300);
        const [promptLabel, prompt] = number("lk-bench-prompt", "Prompt tokens", 2000);
        const run = el("button", "lk-btn lk-btn-secondary", "Run");
        run.type = "button";
        run.id = "lk-bench-run";
        form.append(mode, predictLabel, promptLabel, run);

        const status = el("p", "lk-small");
        status.id = "lk-bench-status";
        const bar = el("progress", "lk-bench-bar");
        bar.id = "lk-bench-progress";
        bar.hidden = true;
        const phases = el("ol", "lk-small lk-muted lk-bench-phases");
        phases.id = "lk-bench-phases";

        const now = el("div", "lk-bench-col");
        now.id = "lk-bench-result";
        now.append(el("h4", "lk-bench-head", "This run"));
        const nowBody = el("div");
        now.appendChild(nowBody);
        const stored = el("div", "lk-bench-col");
        stored.id = "lk-bench-stored";
        stored.append(el("h4", "lk-bench-head", "Stored for this configuration"));
        const storedBody = el("div");
        stored.appendChild(storedBody);
        const cols = el("div", "lk-bench-cols");
        cols.append(now, stored);
        box.append(form, status, bar, phases, cols);

        // What happened, in order, for whoever reads the page (a test among them):
        // "progress" for each BenchProgress, "result" or "error" when the call ends.
        const events = [];
        const record = what => {
            events.push(what);
            box.dataset.events = events.slice(-50).join(" ");
        };
        let gone = false;
        let lastStored = null;

        function onProgress(event, preset, phase, step, steps) {
            if (preset !== view.name || gone)
                return;
            bar.hidden = false;
            bar.max = Math.max(steps, 1);
            bar.value = step;
            status.textContent = "Step " + step + " of " + steps + ": " + phase + "…";
            phases.appendChild(el("li", "", phase));
            record("progress");
        }
        lokid.manager.addEventListener("BenchProgress", onProgress);

        run.addEventListener("click", () => {
            // a u on the bus: an empty or negative box is the default (0); too many tokens
            // are the daemon's to refuse, in its words
            const count = input => Math.max(0, Math.floor(Number(input.value) || 0));
            const args = [view.name, mode.value, count(predict), count(prompt)];
            run.disabled = true;
            phases.replaceChildren();
            nowBody.replaceChildren();
            status.className = "lk-small";
            status.textContent = "Asking lokid for a " + args[1] + " benchmark of " + view.name + "…";
            record("asked");
            lokid.manager.call("Bench", args, { timeout: BENCH_TIMEOUT_MS })
                    .then(([outcome]) => {
                        if (gone)
                            return;
                        const out = plain(outcome);
                        bar.value = bar.max;
                        nowBody.replaceChildren(table(out.result || {}, "lk-bench-now-table"));
                        const where = out.url ? " at " + out.url : "";
                        status.textContent = "Done" + where + ". " + (out.saved
                            ? "Kept as this configuration's result."
                            : "Not kept: " + (out.not_saved_reason || "the result is partial") + ".");
                        record("result");
                    })
                    .catch(ex => {
                        if (gone)
                            return;
                        bar.hidden = true;
                        status.className = "lk-small lk-error";
                        status.textContent = (lokid.refused(ex) ? "Not permitted: " : "") +
                            "Bench " + view.name + " failed: " + lokid.describe(ex);
                        record("error");
                    })
                    .finally(() => { run.disabled = false });
        });

        function showStored(p) {
            const last = p ? plain(p.LastBench || {}) : {};
            if (!last.result) {
                storedBody.replaceChildren(el("p", "lk-muted lk-small",
                                              "None: no complete benchmark of this model, its GPUs " +
                                              "and arguments is stored."));
                return;
            }
            const when = typeof last.at === "number" ? new Date(last.at * 1000).toLocaleString() : "";
            storedBody.replaceChildren(
                el("p", "lk-muted lk-small", [when, last.model, last.engine].filter(Boolean).join(" · ")),
                table(last.result, "lk-bench-stored-table"));
            stored.dataset.at = String(last.at);
        }

        return {
            update() {
                const p = view.proxy();
                const key = p ? p.LastBench : null;
                if (key !== lastStored || !storedBody.childElementCount) {
                    lastStored = key;
                    showStored(p);
                }
            },
            unmount() {
                gone = true;
                lokid.manager.removeEventListener("BenchProgress", onProgress);
            },
        };
    }

    // An engine's only: the daemon refuses to benchmark an external API or a broken preset.
    lokid.sections.push({ id: "bench", title: "Benchmark", order: 50, kinds: ["engine"], mount });
}());
