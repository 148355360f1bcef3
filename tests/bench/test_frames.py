"""Token-chunk frames: a chunk that matches is valid JSON of the same shape with a token."""

import json
import random

from tuner.bench.frames import learn

VLLM = ('{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732000000,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}')


def test_a_chunk_of_the_same_template_matches_whatever_its_text_id_and_numbers():
    frame = learn(VLLM, "content")
    later = VLLM.replace("Hello", ' w\\"orld \\u00e9').replace("chatcmpl-1", "chatcmpl-2")
    assert frame.fullmatch(later.replace("1732000000", "1732000001"))


def test_truncated_other_shapes_and_the_last_chunk_do_not_match():
    frame = learn(VLLM, "content")
    for other in (VLLM[:-3], VLLM[:60], VLLM.replace('"Hello"', '""'),
                  VLLM.replace('"Hello"', "null"),
                  VLLM.replace('"finish_reason":null', '"finish_reason":"length"'),
                  VLLM[:-1] + ',"usage":{"completion_tokens":9}}',
                  VLLM.replace('"choices"', '"xhoices"'), VLLM.replace("Hello", "He\\llo"),
                  VLLM.replace("1732000000", "01"), VLLM.replace("Hello", "a\nb")):
        assert not frame.fullmatch(other), other


def test_a_text_key_that_is_not_unique_learns_no_frame():
    both = VLLM.replace('"logprobs":null', '"logprobs":{"content":"x"}')
    assert learn(both, "content") is None
    assert learn(VLLM.replace('"content"', '"content" '), "content") is not None  # space, colon


def test_no_string_that_matches_a_frame_is_invalid_json():
    frame = learn(VLLM, "content")
    rng = random.Random(0)
    alphabet = '{}[]",:\\0123456789-.eEnulltrfasHo x'
    matched = 0
    for _ in range(20000):
        chars = list(VLLM)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.4:
                chars[i] = rng.choice(alphabet)
            elif op < 0.7:
                chars.insert(i, rng.choice(alphabet))
            else:
                del chars[i]
        text = "".join(chars)
        if frame.fullmatch(text):
            matched += 1
            obj = json.loads(text)  # raises if the frame let invalid JSON through
            choice = obj["choices"][0]
            assert choice["delta"]["content"] and choice["finish_reason"] is None
    assert matched > 1000  # the mutations do exercise accepted chunks
