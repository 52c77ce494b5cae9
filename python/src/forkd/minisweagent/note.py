"""A handoff note, written the recovery pilot's way: one tool-free request to the agent's
own model, shown its own full conversation (reasoning content is not passed on), asking
for a note of at most 400 words for whoever continues from its final state.

    python -m forkd.minisweagent.note BRIEF.json

The brief: `trajectory` (a mini-swe-agent trajectory file), `configs` and `model` (as
for `forkd.minisweagent.evalrun`: the model the agent ran with), `out` (the note file).
The conversation is passed as text (commands and their output as the agent saw them),
so that any chat model takes it whatever its tool-calling support. Exit 0 with the note
written; 75 when the model endpoint failed; 78 for a configuration that does not load.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .evalrun import EXIT_BAD_CONFIG, EXIT_INFRA, _quiet_harness, build

MAX_WORDS = 400

PROMPT = (
    "Another engineer will continue this task from the exact state you left the machine "
    "in. Write them a handoff note of at most 400 words: what you found, what you changed "
    "and where, how you checked it, and what may still be wrong or unfinished. Write plain "
    "text. Do not call any tools and do not run commands."
)


def transcript(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The conversation as plain chat messages: commands and observations as text, no
    tool-call structure, no reasoning content."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, list):  # multimodal parts: keep the text ones
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = content or ""
        if role == "system":
            out.append({"role": "system", "content": content})
        elif role == "user":
            out.append({"role": "user", "content": content})
        elif role == "assistant":
            commands = [a.get("command", "") for a in (m.get("extra") or {}).get("actions", [])]
            text = content
            for c in commands:
                text += f"\n\n[command]\n{c}"
            out.append({"role": "assistant", "content": text.strip() or "(no text)"})
        elif role == "tool":
            out.append({"role": "user", "content": f"[command output]\n{content}"})
        elif role == "exit":
            out.append({"role": "user", "content": f"[the run ended: {(m.get('extra') or {}).get('exit_status', '')}]"})
    return out


def limit_words(text: str, n: int = MAX_WORDS) -> str:
    words = text.split()
    return text.strip() if len(words) <= n else " ".join(words[:n])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m forkd.minisweagent.note BRIEF.json", file=sys.stderr)
        return 2
    _quiet_harness()
    brief = json.loads(Path(argv[0]).read_text())
    try:
        model, _, _ = build(brief)
    except Exception as e:  # noqa: BLE001 - reported by name
        print(f"note: configuration {brief.get('configs')}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    trajectory = json.loads(Path(brief["trajectory"]).read_text())
    messages = transcript(trajectory.get("messages", []))
    messages.append({"role": "user", "content": PROMPT})
    import litellm

    kwargs = dict(getattr(model.config, "model_kwargs", {}) or {})
    name = getattr(model.config, "model_name", brief.get("model"))
    try:
        response = litellm.completion(model=name, messages=messages, **kwargs)
        text = response.choices[0].message.content or ""
    except Exception as e:  # noqa: BLE001 - the endpoint's failure is infrastructure
        print(f"note: model {name}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_INFRA
    note = limit_words(text)
    if not note:
        print(f"note: model {name} answered no text", file=sys.stderr)
        return EXIT_INFRA
    out = Path(brief["out"])
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(note + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
