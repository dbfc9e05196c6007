"""What a reward-design iteration sends to and gets from the LLM: characters and tokens per stage.

Usage: python experiments/llm_tokens.py RUN_DIR

Reads RUN_DIR/llm/record.jsonl (any backend) and prints, per stage, the requests, the
prompt and reply characters, and tokens: as the server counted them, or estimated at 4
characters a token where it did not (the offline proposer; its programs are about as long
as an LLM's). Writes results/llm_tokens.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from common import print_table, write_results

from jaxrace.llm.base import text_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    args = parser.parse_args()
    record = Path(args.run_dir) / "llm" / "record.jsonl"
    stages: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for line in record.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        s = stages[e["stage"]]
        s["requests"] += 1
        s["prompt_chars"] += sum(len(text_of(m["content"])) for m in e["request"]["messages"])
        s["reply_chars"] += len(e["reply"]["text"])
        s["prompt_tokens"] += e["reply"]["prompt_tokens"]
        s["completion_tokens"] += e["reply"]["completion_tokens"]
        s["estimated"] = max(s["estimated"], float(e["reply"]["estimated"]))
    rows, table = [], []
    for stage, s in stages.items():
        n = int(s["requests"])
        table.append([stage, n, f"{s['prompt_chars'] / n:,.0f}", f"{s['reply_chars'] / n:,.0f}",
                      f"{s['prompt_tokens']:,.0f}", f"{s['completion_tokens']:,.0f}",
                      f"{s['prompt_tokens'] + s['completion_tokens']:,.0f}", "yes" if s["estimated"] else "no"])
        rows += [{"name": f"{stage} requests", "value": n, "unit": "requests"},
                 {"name": f"{stage} prompt characters per request", "value": round(s["prompt_chars"] / n),
                  "unit": "characters"},
                 {"name": f"{stage} reply characters per request", "value": round(s["reply_chars"] / n),
                  "unit": "characters"},
                 {"name": f"{stage} tokens", "value": int(s["prompt_tokens"] + s["completion_tokens"]),
                  "unit": "tokens", "estimated": bool(s["estimated"])}]
    print(f"{record}: model(s) {sorted({json.loads(x)['model'] for x in record.read_text().splitlines()})}")
    print_table(["stage", "requests", "prompt chars/request", "reply chars/request", "prompt tokens",
                 "completion tokens", "tokens", "estimated"], table)
    print(f"wrote {write_results(__file__, rows)}")


if __name__ == "__main__":
    main()
