"""Synthetic chat data for the fine-tuning tests: N conversations in JSONL, alternating the two
forms tokenize_chat.py reads, about adding numbers (learnable: the answers follow from the
prompts):
  {"prompt": "Add a and b.", "completion": "The sum is a+b."}
  {"messages": [system, user, assistant, user, assistant]}

  python make_chats.py OUT.jsonl [--count 300] [--seed 1]
"""
import argparse, json, random


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    random.seed(a.seed)
    with open(a.out, "w") as f:
        for i in range(a.count):
            x, y = random.randint(1, 50), random.randint(1, 50)
            if i % 2:
                f.write(json.dumps({"messages": [
                    {"role": "system", "content": "You add numbers."},
                    {"role": "user", "content": f"What is {x} plus {y}?"},
                    {"role": "assistant", "content": f"{x} plus {y} is {x + y}."},
                    {"role": "user", "content": "And doubled?"},
                    {"role": "assistant", "content": f"Doubled it is {2 * (x + y)}."}]}) + "\n")
            else:
                f.write(json.dumps({"prompt": f"Add {x} and {y}.",
                                    "completion": f"The sum is {x + y}."}) + "\n")


if __name__ == "__main__":
    main()
