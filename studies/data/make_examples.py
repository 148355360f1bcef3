"""Write the small example workload files next to this script (deterministic: seed 0).

Nothing here is downloaded or copied from a real dataset: the text is random common words and
the lengths are lognormal with medians and spreads we picked to look like chat traffic (short
questions, longer answers, a heavy tail); they are not a measurement of any dataset.

* chat.sharegpt.json: 100 conversations in ShareGPT's format (2-4 turns, human/gpt);
* requests.jsonl: 120 requests, {input_len, output_len}, a few with a prompt text instead;
* trace.jsonl: 400 requests with bursty arrivals (a rate switching between 3 and 12 req/s),
  Mooncake-style fields; a third of them start with one of 4 shared 1024-token system prompts
  (`hash_ids`, one id per 512 tokens).
Run: python studies/data/make_examples.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head").split()


def length(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(median * math.exp(rng.gauss(0.0, sigma)))))


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def sharegpt(rng: random.Random) -> list[dict]:
    out = []
    for i in range(100):
        turns = []
        for _ in range(rng.choice((1, 1, 1, 2))):
            turns.append({"from": "human", "value": text(rng, length(rng, 50, 1.0, 4, 1200))})
            turns.append({"from": "gpt", "value": text(rng, length(rng, 150, 0.8, 4, 1200))})
        out.append({"id": f"example-{i}", "conversations": turns})
    return out


def requests_jsonl(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for i in range(120):
        row: dict = {"output_len": length(rng, 160, 0.7, 8, 2048)}
        if i % 10 == 0:
            row["prompt"] = text(rng, length(rng, 80, 0.8, 4, 2048))
        else:
            row["input_len"] = length(rng, 300, 1.0, 8, 6000)
        out.append(row)
    return out


def trace(rng: random.Random) -> list[dict]:
    out, t, rate = [], 0.0, 3.0
    for _ in range(400):
        if rng.random() < 0.05:
            rate = 15.0 - rate  # switch between 3 and 12 req/s
        t += rng.expovariate(rate)
        row = {"timestamp": round(t * 1000.0, 3),
               "input_length": length(rng, 400, 0.9, 16, 6000),
               "output_length": length(rng, 150, 0.7, 8, 1500)}
        if rng.random() < 1 / 3:
            g = rng.randrange(4)
            row["input_length"] += 1024
            row["hash_ids"] = [2 * g, 2 * g + 1]
        out.append(row)
    return out


def main() -> None:
    rng = random.Random(0)
    (HERE / "chat.sharegpt.json").write_text(json.dumps(sharegpt(rng), indent=1) + "\n")
    for name, rows in (("requests.jsonl", requests_jsonl(rng)), ("trace.jsonl", trace(rng))):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
