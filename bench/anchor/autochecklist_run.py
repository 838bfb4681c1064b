"""Run autochecklist 0.2.3 on a JSON-lines file against an OpenAI-compatible server; print timing JSON."""

import argparse
import json
import time

from autochecklist import pipeline


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--data", required=True)
    args = ap.parse_args()
    with open(args.data) as f:
        data = [json.loads(line) for line in f if line.strip()]
    for d in data:
        d.pop("id", None)
    pipe = pipeline(
        args.preset,
        generator_model="scripted",
        scorer_model="scripted",
        provider="openai",
        base_url=args.base_url,
        api_key="bench",
    )
    started = time.perf_counter()
    result = pipe.run_batch(data)
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "tool": "autochecklist",
                "preset": args.preset,
                "records": len(data),
                "scored": len(result.scores),
                "wall_s": round(wall, 3),
                "macro_pass_rate": result.macro_pass_rate,
            }
        )
    )


if __name__ == "__main__":
    main()
