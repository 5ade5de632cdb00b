"""Environment text between model turns, tokenised alone between the chat template's delimiters.

A model turn ends with its end-of-turn token (the tokenizer's EOS: `<|end|>` for the tiny
model, `<|im_end|>` for Qwen). What the chat template writes from there to the start of the next
assistant turn is found once, by rendering a conversation around two placeholders:

    [user, assistant: A, tool: T] + generation prompt
    -> ...A<|im_end|>\\n<|im_start|>user\\n<tool_response>\\nT\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n

`before` is the text between A's end-of-turn token and T, `after` the text from T to the end.
A tool message is then `before + content + after`, tokenised on its own and appended after the
model's tokens, so the episode's tokens are the template's rendering of the conversation
without ever re-tokenising what the model wrote. Not here: what the content says
(`asyncrl.agents.tool_episode`).
"""

from __future__ import annotations

from typing import Any

from asyncrl.errors import ConfigError

ASSISTANT_MARK = "ASYNCRLASSISTANTMARK"
CONTENT_MARK = "ASYNCRLCONTENTMARK"


class MessageTemplate:
    """The chat template's delimiters around a message of `role` after an assistant turn.

    Example (the tiny model's template, role "tool"): before "<|tool|>", after
    "<|end|><|assistant|>"; encode("7") is the ids of "<|tool|>7<|end|><|assistant|>".
    """

    def __init__(self, tokenizer: Any, role: str = "tool", template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.role = role
        self.before, self.after = delimiters(tokenizer, role, template_kwargs or {})

    def text(self, content: str) -> str:
        return self.before + content + self.after

    def encode(self, content: str) -> list[int]:
        """The ids of one message (delimiters included) as the tokenizer reads it alone."""
        return list(self.tokenizer.encode(self.text(content), add_special_tokens=False))


def delimiters(tokenizer: Any, role: str, template_kwargs: dict[str, Any]) -> tuple[str, str]:
    """(before, after): what the chat template writes after an assistant turn's end-of-turn
    token up to a `role` message's content, and after the content up to the next assistant
    turn's first generated token."""
    messages = [{"role": "user", "content": "U"}, {"role": "assistant", "content": ASSISTANT_MARK},
                {"role": role, "content": CONTENT_MARK}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **template_kwargs)
    except Exception as exc:  # a template may reject a role it does not know
        raise ConfigError(f"the chat template cannot render a '{role}' message after an assistant turn "
                          f"({type(exc).__name__}: {exc}); set data.chat_template to one that can") from exc
    if ASSISTANT_MARK not in text or CONTENT_MARK not in text:
        raise ConfigError(f"the chat template drops the content of assistant or '{role}' messages; "
                          "set data.chat_template to one that renders them")
    start = text.index(ASSISTANT_MARK) + len(ASSISTANT_MARK)
    mark = text.index(CONTENT_MARK, start)
    between = text[start:mark]
    end_of_turn = tokenizer.eos_token or ""
    # the model's own end-of-turn token closed its turn: the message starts after it
    before = between[len(end_of_turn):] if end_of_turn and between.startswith(end_of_turn) else between
    return before, text[mark + len(CONTENT_MARK):]
