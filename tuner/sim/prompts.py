"""How the simulator counts prompt tokens without a tokenizer.

The tuner's load generator sends prompts of `input_len` whitespace-separated words and knows
their length, so one word = one token.  A chat request also pays for the chat template: Llama-3.1's
template wraps the messages in header tokens and inserts its default system header ("Cutting
Knowledge Date ... Today Date ..."), about 36 tokens.  Counting them matters: it is why a
256-word prompt with 256 output tokens needs 3 blocks of 256, not 2 (the seed's con=64 ablation
runs about 21 requests at once on 64 blocks).
"""

from __future__ import annotations

from typing import Any

CHAT_TEMPLATE_TOKENS = 36


def words(text: Any) -> int:
    """Whitespace-separated words of a string or of OpenAI content parts."""
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list):
        return sum(words(part.get("text", "")) for part in text if isinstance(part, dict))
    return 0


def chat_prompt_tokens(messages: Any) -> int:
    """Tokens of a chat request: the words of every message plus the template."""
    if not isinstance(messages, list):
        return CHAT_TEMPLATE_TOKENS
    body = sum(words(m.get("content", "")) for m in messages if isinstance(m, dict))
    return body + CHAT_TEMPLATE_TOKENS


def completion_prompt_tokens(prompt: Any) -> int:
    """Tokens of a raw completion prompt (at least one: the BOS token)."""
    return max(1, words(prompt) if not isinstance(prompt, list) else sum(map(words, prompt)))


def chat_prompt_words(messages: Any) -> list[str]:
    """The token stream a chat request stands for, for the prefix cache's block hashes: the
    template's tokens (the same for every request), then each message's words."""
    out = ["<|template|>"] * CHAT_TEMPLATE_TOKENS
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content", "")
                if isinstance(content, list):
                    content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
                out += content.split() if isinstance(content, str) else []
    return out
