"""The default progress line: what `ctx.progress(state)` shows without a DESCRIBE_STATE hook.

`{"step": 2, "of": 3, "name": "verify"}` reads `step 2/3 (verify)` (without a name,
`step 2/3`); any other object reads as a short `key: value` join, and any other value as its
text, cut at SUMMARY_LIMIT characters (docs/lifecycle.md#progress).
"""

import json

from ..conf import app_settings


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def default_line(state: object) -> str:
    """Render a progress state without a hook."""
    if state is None:
        return ""
    if isinstance(state, dict):
        if "step" in state and "of" in state:
            line = f"step {_text(state['step'])}/{_text(state['of'])}"
            if state.get("name"):
                line += f" ({_text(state['name'])})"
        else:
            line = ", ".join(f"{key}: {_text(value)}" for key, value in state.items())
    else:
        line = _text(state)
    return line[: int(app_settings.SUMMARY_LIMIT)]
