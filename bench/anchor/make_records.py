"""Write N distinct evaluation records (input, target, reference) as JSON lines."""

import json
import sys

TOPICS = ["tides", "volcanoes", "bees", "glaciers", "comets", "coral reefs", "deserts", "owls", "rivers", "lichens"]

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
for i in range(n):
    topic = TOPICS[i % len(TOPICS)]
    print(json.dumps({
        "id": f"r{i}",
        "input": f"Explain {topic} to a ten-year-old in at most {40 + i} words (request {i}).",
        "target": f"{topic.capitalize()} are fascinating. Here is a short, friendly explanation number {i}.",
        "reference": f"A clear, accurate, age-appropriate explanation of {topic} in under {40 + i} words.",
    }))
