"""lokid.ctl.stats: the rows and columns of `lokictl top`, from a preset's properties."""

from __future__ import annotations

from lokid.ctl import stats as ctlstats


def test_gpu_memory_sums_kinds_per_device_and_leaves_host_buffers_out() -> None:
    # the real partial offload on an H200 (recipes: b11434-cuda-h200-mid_fitt_auto.log)
    memory = {"CUDA0 model": 920.22, "CUDA0 KV": 256.0, "CUDA0 compute": 112.01,
              "CPU_Mapped model": 3104.0, "CUDA_Host compute": 40.02, "CPU output": 0.5}
    assert ctlstats.gpu_memory(memory) == {"CUDA0": 920.22 + 256.0 + 112.01}
    assert ctlstats.gpu_memory(None) == {}


def test_a_row_shows_live_figures_only_while_the_engine_runs() -> None:
    stats = {"url": "http://127.0.0.1:8080", "uptime_seconds": 3725.0, "requests": 12,
             "requests_per_min": 2.5, "prefill_tps": {"1m": 900.4, "all": 850.0},
             "decode_tps": {"all": 41.6}, "memory_mib": {"CUDA0 model": 2048.0},
             "offload": ["10/10", "2/2"], "draft": {"kind": "mtp", "acceptance": 0.8125}}
    props = {"Name": "qwen", "State": "ready", "Model": "q.gguf", "Stats": stats,
             "AutoSpecBlocked": ""}
    r = ctlstats.row(props)
    assert (r["prefill_tps"], r["decode_tps"]) == (900.4, 41.6)  # 1m, else all
    assert ctlstats.cells(r) == ["qwen", "ready", "http://127.0.0.1:8080", "q.gguf", "1h02m",
                                 "CUDA0 2.0G", "10/10,2/2", "2.5", "900", "42", "81% mtp", "-"]
    stopped = ctlstats.row({**props, "State": "inactive"})
    assert stopped["uptime_seconds"] is None and stopped["gpu_memory_mib"] == {}
    assert (stopped["url"], stopped["requests_per_min"], stopped["decode_tps"]) == \
        (None, None, None)
    assert stopped["requests"] == 12   # its last start's total stays


def test_the_table_aligns_columns_and_cuts_to_the_terminal() -> None:
    rows = [ctlstats.row({"Name": n, "State": "inactive", "Model": "m.gguf", "Stats": {},
                          "AutoSpecBlocked": "a long recorded verdict " * 3})
            for n in ("a", "longer-name")]
    text = ctlstats.table(rows, width=60)
    lines = text.splitlines()
    assert lines[0].startswith("PRESET       STATE") and all(len(x) <= 60 for x in lines)
    assert lines[1].index("inactive") == lines[2].index("inactive")


def test_stats_text_says_where_memory_comes_from_or_why_it_is_unknown() -> None:
    nvml = ctlstats.stats_text("p", {"requests": 1, "memory_mib": {"GPU0 process": 3072.0},
                                     "memory_source": "NVIDIA driver (NVML), per process"})
    assert "  memory (NVIDIA driver (NVML), per process): GPU0 process 3.0G" in nvml
    unknown = ctlstats.stats_text("p", {"requests": 1, "memory_note": "python3-pynvml is not "
                                        "installed"})
    assert "  memory: unknown: python3-pynvml is not installed" in unknown
    assert "memory" not in ctlstats.stats_text("p", {"requests": 1})


def test_the_request_count_agrees_with_its_noun() -> None:
    one = ctlstats.stats_text("p", {"requests": 1, "invocation": "i"})
    assert one.startswith("p: 1 request, "), one
    assert ctlstats.stats_text("p", {"requests": 2}).startswith("p: 2 requests, ")
    assert ctlstats.stats_text("p", {"requests": 0, "invocation": "i"}).startswith(
        "p: 0 requests, ")


def test_a_window_without_requests_says_so_not_that_no_start_was_seen() -> None:
    # lokictl stats --since: the journal's figures over the window carry no invocation
    assert ctlstats.stats_text("p", {"requests": 0}, "10min") == "p: no request since 10min"
    assert ctlstats.stats_text("p", {"requests": 0}) == "p: no start seen yet"
    assert ctlstats.stats_text("p", {"requests": 2}, "10min").startswith("p: 2 requests, ")


def test_a_presets_need_in_a_few_characters() -> None:
    MiB, GiB = 2**20, 2**30
    est = {"needs": {"host": 512 * MiB, "GPU0": 17 * GiB},
           "sources": {"host": "estimate", "GPU0": "estimate"}}
    assert ctlstats.need_text(est) == "GPU0 17.0G host 512M est"
    part = {**est, "sources": {"host": "estimate", "GPU0": "nvml"}}
    assert ctlstats.need_text(part) == "GPU0 17.0G host 512M part measured"
    whole = {**est, "sources": {"host": "cgroup", "GPU0": "nvml"}}
    assert ctlstats.need_text(whole).endswith(" measured")
    uuids = {"needs": {"host": GiB}, "sources": {"host": "estimate"}, "gpu_count": 2,
             "per_gpu": 40 * GiB}
    assert ctlstats.need_text(uuids) == "host 1.0G 2x40.0G est"
    assert ctlstats.need_text({}) == "-"


def test_the_devices_table_with_what_could_not_be_read() -> None:
    MiB = 2**20
    rows = [{"device": "GPU0", "name": "NVIDIA H200", "total": 143155 * MiB, "lokid": 674 * MiB,
             "others": 526 * MiB, "reserve": 0, "free": 141955 * MiB,
             "source": "the NVIDIA driver (NVML)"},
            {"device": "host", "total": 24 * 2**30, "lokid": 0, "others": 900 * MiB,
             "reserve": 2**30, "free": 20 * 2**30, "source": "/proc/meminfo",
             "notes": ["python3-pynvml is not installed"]}]
    lines = ctlstats.devices_table(rows).splitlines()
    assert lines[0].split() == ["DEVICE", "TOTAL", "LOKID", "OTHERS", "RESERVED", "FREE", "FROM"]
    assert lines[1].split()[:8] == ["GPU0", "(NVIDIA", "H200)", "139.8G", "674M", "526M", "0M",
                                    "138.6G"]
    assert lines[2].split()[:6] == ["host", "24.0G", "0M", "900M", "1.0G", "20.0G"]
    assert lines[3] == "  note: python3-pynvml is not installed"
    assert ctlstats.devices_table([]) == "no device read yet"


def test_why_presets_wait_for_memory_under_the_devices() -> None:
    assert ctlstats.waits_text({}) == ""
    text = ctlstats.waits_text({"qwen": "2 requests waiting 12 s: preset 'qwen' needs "
                                        "18.2 GiB on one GPU: waits, because GPU0 has 6.1 GiB "
                                        "free", "a": "1 request waiting 0 s: x"}, width=60)
    lines = text.splitlines()
    assert lines[0] == "waiting for memory:"
    assert lines[1] == "  a: 1 request waiting 0 s: x"   # by name
    assert lines[2].startswith("  qwen: 2 requests waiting 12 s: preset 'qwen' needs")
    assert len(lines[2]) == 60 and lines[2].endswith("…")


def test_a_gpu_engine_on_the_cpu_is_said_in_top() -> None:
    """Issue 44, item 3: the recorded Vulkan build without a device said "offloaded 3/3"
    with CPU buffers only; the Stats' on_cpu reaches the OFFLOAD and VERDICT columns."""
    why = ("it says offloaded 3/3 layers to GPU, but every buffer is in host memory (no GPU "
           "device: the RPC backend counts as offload): the model runs on the CPU")
    stats = {"url": "http://127.0.0.1:8080", "uptime_seconds": 5.0, "offload": ["3/3"],
             "on_cpu": why}
    r = ctlstats.row({"Name": "v", "State": "ready", "Model": "t.gguf", "Stats": stats,
                      "AutoSpecBlocked": ""})
    cells = ctlstats.cells(r)
    assert cells[6] == "3/3 CPU" and cells[-1] == why
    assert f"on the CPU: {why}" in ctlstats.stats_text("v", {**stats, "invocation": "i"})
