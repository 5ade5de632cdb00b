"""Every verl key's class, and the Markdown list of them in docs/migrating.md (generated, tested).

A verl key is `mapped` (onto asyncrl keys, `verl.TABLE`), `fixed` (asyncrl always runs it with the
values listed; another value changes what is trained and `asyncrl train` refuses it), a `knob`
(an engine, memory or logging setting with no effect here, `verl_knobs.NOT_MODELLED`), or one of
two dict-valued keys read entry by entry: `chat template` (apply_chat_template_kwargs, mapped) and
`model override` (override_config: its max_position_embeddings mapped, any other entry refused).

    asyncrl config --verl-reference      # the list docs/migrating.md holds between its markers
"""

from __future__ import annotations

from collections import defaultdict

from asyncrl.config.verl import CHAT_KWARGS, OVERRIDE_CONFIG, TABLE, is_verl_key

BEGIN, END = "<!-- verl keys: begin (asyncrl config --verl-reference) -->", "<!-- verl keys: end -->"


def key_class(key: str) -> str:
    """mapped | fixed | knob | chat template | model override | ours | unknown (see the module docstring)."""
    if key in TABLE:
        return "fixed" if not TABLE[key].ours else "mapped"
    if f"{key}.".startswith(CHAT_KWARGS):
        return "chat template"
    if key.startswith(OVERRIDE_CONFIG):
        return "model override"
    return "knob" if is_verl_key(key) else "unknown"


def reference() -> str:
    """The Markdown of docs/migrating.md's key list, between `BEGIN` and `END`."""
    from asyncrl.config.verl_knobs import NOT_MODELLED

    mapped = [f"| `{k}` | {', '.join(f'`{o}`' for o in t.ours if not o.startswith('@')) or '(with others)'} |"
              for k, t in sorted(TABLE.items()) if t.ours]
    fixed = [f"| `{k}` | {', '.join(f'`{v}`' for v in t.fixed)} |" for k, t in sorted(TABLE.items()) if not t.ours]
    knobs: dict[str, list[str]] = defaultdict(list)
    for key in sorted(NOT_MODELLED):
        section, _, leaf = key.rpartition(".")
        knobs[section or key].append(leaf if section else "(all)")
    return "\n".join([
        BEGIN, "", f"**Mapped** ({len(mapped)} keys; `(with others)`: read together with other keys):", "",
        "| verl key | asyncrl key |", "|---|---|", *mapped, "",
        f"**Fixed** ({len(fixed)} keys: asyncrl runs them with these values; `asyncrl train` refuses another):", "",
        "| verl key | values |", "|---|---|", *fixed, "",
        f"**Knobs with no effect here** (warned, ignored): {len(NOT_MODELLED)} keys and subtrees:", "",
        *[f"- `{section}`: {' '.join(f'`{leaf}`' for leaf in leaves)}" for section, leaves in sorted(knobs.items())],
        "", f"Also: `{CHAT_KWARGS}*` (mapped to data.chat_template_kwargs) and `{OVERRIDE_CONFIG}*` "
        "(max_position_embeddings mapped, any other entry refused).", "", END])
