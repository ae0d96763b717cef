"""lokid.core.config.files under fuzzing: any text in presets/ is a preset or one preset's error.

Apart from tests/core/config/test_config.py because it needs hypothesis, which the Debian
build's own test run (debian/rules) does not install. LOKID_FUZZ_EXAMPLES sets the
number of examples (300 by default; 6,000 were run once for issue 13).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lokid.core.config import files as cfg

_TOML_PIECES = ['model = "m.gguf"\n', "[spec]\n", "[chat]\n", "[env]\n", "mode = ", '"auto"',
                "ctx = ", "4096", "[", "]", "{", "}", ",", ".", "=", '"', "'", '"""', "#",
                "\n", "a", "env", "gpus", "extra_args", "\\u0000", "\\n", "\x00", "\x1b",
                "1.5", "true", "1979-05-27", "\udcff", "é", " "]


@settings(max_examples=int(os.environ.get("LOKID_FUZZ_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_TOML_PIECES), max_size=60) | st.text(max_size=300))
def test_any_text_is_a_preset_or_one_line_error_of_its_own(tmp_path: Path,
                                                           parts: list[str] | str) -> None:
    text = parts if isinstance(parts, str) else "".join(parts)
    presets = tmp_path / "presets"
    presets.mkdir(exist_ok=True)
    (presets / "fuzz.toml").write_bytes(text.encode("utf-8", "surrogateescape"))
    (presets / "good.toml").write_text('model = "m.gguf"\n')
    good, bad = cfg.load_presets(str(tmp_path))
    assert "good" in good
    assert ("fuzz" in good) != ("fuzz" in bad)
    if "fuzz" in bad:
        message = str(bad["fuzz"])
        assert message.isprintable() or all(c.isprintable() or c == " " for c in message), \
            repr(message)
        assert "internal error" not in message, message
