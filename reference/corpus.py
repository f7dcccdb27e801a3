"""Deterministic synthetic corpus for the project's own tiny reference model.

No model or dataset hub is reachable from the machines this project is built and
tested on, and public corpora come with licence questions. So the project writes
its own text: a small invented "world" (people, cities, rivers, pets, foods, jobs,
plus simple arithmetic and the order of days and months) rendered through varied
sentence templates into short paragraphs. The world is small enough that a
~1 M-parameter model learns it to a low perplexity in a few minutes on a CPU, and
the facts are specific enough that quantization noise measurably changes the
perplexity and the multiple-choice accuracy.

Everything is derived from one integer seed with ``random.Random`` (never the
global RNG and never set iteration order), so two runs write byte-identical files.

Usage::

    python -m reference.corpus --out data/ [--seed 1234] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

DEFAULT_SEED = 1234
TRAIN_PARAGRAPHS = 5000
HELDOUT_PARAGRAPHS = 400
HELDOUT_PPL_ROWS = 100
CALIBRATION_ROWS = 512
CHAT_ROWS = 320
# Passkey retrieval (issue: gates that catch long-context loss under fp8 KV): a key, then filler,
# then the question. ~35 tokens per filler sentence group; 12 groups make ~470 tokens, the longest
# that fits max_model_len 512 with the answer. Training documents take 0..12 groups.
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_MAX_FILLER = 12
PASSKEY_TRAIN_DOCS = 1000
PASSKEY_EVAL_ROWS = 100
# Eval sets by their longest row in tokens (query + answer, <s> included; a test checks): filler groups
PASSKEY_LENGTHS = {"128": 2, "268": 6, "478": 12}
N_PEOPLE = 64
N_CITIES = 16

COLORS = [
    "red",
    "blue",
    "green",
    "yellow",
    "purple",
    "orange",
    "white",
    "black",
    "pink",
    "brown",
    "gray",
    "gold",
]
FOODS = [
    "apples",
    "bread",
    "rice",
    "soup",
    "cheese",
    "fish",
    "honey",
    "beans",
    "plums",
    "noodles",
    "carrots",
    "eggs",
]
PETS = ["cat", "dog", "rabbit", "parrot", "turtle", "goat", "horse", "hamster", "duck", "frog", "owl", "fox"]
JOBS = ["baker", "teacher", "farmer", "doctor", "painter", "sailor", "builder", "singer", "tailor", "miner"]
REGIONS = ["the north", "the south", "the east", "the west"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]

# Syllables for invented names: chosen so that the names are not English words.
PERSON_ONSETS = [
    "Ma",
    "To",
    "Ri",
    "Ka",
    "Le",
    "No",
    "Sa",
    "Vi",
    "De",
    "Lo",
    "Be",
    "Ru",
    "Fe",
    "Zo",
    "Pi",
    "Ga",
    "Mo",
    "Ti",
    "Ya",
    "Du",
]
PERSON_CODAS = ["rel", "van", "lin", "sko", "dra", "mir", "bek", "nor", "tha", "quin", "lio", "zan"]
CITY_STEMS = [
    "Bral",
    "Kest",
    "Orm",
    "Vell",
    "Dun",
    "Tarn",
    "Pell",
    "Quar",
    "Hask",
    "Lom",
    "Siv",
    "Grend",
    "Wix",
    "Carr",
    "Fen",
    "Jor",
    "Ulm",
    "Ebb",
    "Nim",
    "Yar",
]
CITY_SUFFIXES = ["ford", "mere", "holm", "by", "wick", "dale"]
RIVER_NAMES = ["Olun", "Ista", "Verro", "Maskel", "Tibbe", "Arnow"]


@dataclass(frozen=True)
class City:
    """An invented city: where it lies and which river runs through it."""

    name: str
    region: str
    river: str


@dataclass(frozen=True)
class Person:
    """An invented person with one fixed value per attribute (the facts to learn)."""

    name: str
    city: str
    color: str
    food: str
    pet: str
    job: str
    age: int


@dataclass(frozen=True)
class World:
    """All facts of the world; rendering only ever reads from here."""

    people: tuple[Person, ...]
    cities: tuple[City, ...]

    def city(self, name: str) -> City:
        """Look a city up by name (the world is tiny, a scan is fine)."""
        return next(c for c in self.cities if c.name == name)


def build_world(seed: int = DEFAULT_SEED) -> World:
    """Draw the world's facts from ``seed``; every other output is rendered from it."""
    rng = random.Random(seed)
    city_names = [stem + rng.choice(CITY_SUFFIXES) for stem in rng.sample(CITY_STEMS, N_CITIES)]
    cities = tuple(
        City(name, REGIONS[i % len(REGIONS)], rng.choice(RIVER_NAMES)) for i, name in enumerate(city_names)
    )
    person_names = _unique_names(rng, N_PEOPLE, lambda r: r.choice(PERSON_ONSETS) + r.choice(PERSON_CODAS))
    # Round-robin homes so that every city has residents to talk about.
    homes = [city_names[i % N_CITIES] for i in range(N_PEOPLE)]
    rng.shuffle(homes)
    people = tuple(
        Person(
            name=name,
            city=homes[i],
            color=rng.choice(COLORS),
            food=rng.choice(FOODS),
            pet=rng.choice(PETS),
            job=rng.choice(JOBS),
            age=rng.randint(18, 70),
        )
        for i, name in enumerate(person_names)
    )
    return World(people=people, cities=cities)


def _unique_names(rng: random.Random, n: int, make: Callable[[random.Random], str]) -> list[str]:
    """Draw ``n`` distinct names whose first three letters also differ (less confusable)."""
    names: list[str] = []
    prefixes: set[str] = set()
    for _ in range(1000 * n):
        name = make(rng)
        if name[:3] not in prefixes:
            names.append(name)
            prefixes.add(name[:3])
        if len(names) == n:
            return names
    raise ValueError(f"cannot draw {n} distinct names from the syllable lists")


# ---------------------------------------------------------------------------
# Sentence rendering
# ---------------------------------------------------------------------------


def article(noun: str) -> str:
    """English indefinite article, so that 'an owl' reads as natural text."""
    return "an" if noun[0] in "aeiou" else "a"


def cap(text: str) -> str:
    """Capitalise a sentence's first letter (number words start some sentences)."""
    return text[:1].upper() + text[1:]


def person_sentence(p: Person, relation: str, rng: random.Random) -> str:
    """One fact about ``p`` in one of several phrasings (the phrasing varies, the fact never does)."""
    n, a = p.name, article(p.pet)
    options = {
        "city": [
            f"{n} lives in {p.city}.",
            f"{n} has a house in {p.city}.",
            f"The home of {n} is {p.city}.",
            f"{n} comes from {p.city}.",
        ],
        "color": [
            f"{n} likes the color {p.color}.",
            f"The favorite color of {n} is {p.color}.",
            f"{n} wears {p.color} clothes every day.",
            f"{n}'s favorite color is {p.color}.",
        ],
        "food": [
            f"{n} likes to eat {p.food}.",
            f"The favorite food of {n} is {p.food}.",
            f"Every morning {n} eats {p.food}.",
            f"{n} loves {p.food} more than any other food.",
        ],
        "pet": [
            f"{n} has a pet {p.pet}.",
            f"The pet of {n} is {a} {p.pet}.",
            f"{n} takes care of {a} {p.pet}.",
            f"{n} lives with {a} {p.pet}.",
        ],
        "job": [
            f"{n} works as a {p.job}.",
            f"{n} is a {p.job}.",
            f"Every day {n} goes to work as a {p.job}.",
            f"The job of {n} is to be a {p.job}.",
        ],
        "age": [f"{n} is {p.age} years old.", f"The age of {n} is {p.age}."],
    }
    return rng.choice(options[relation])


def city_sentence(c: City, relation: str, rng: random.Random) -> str:
    """One fact about a city (region or river)."""
    options = {
        "region": [
            f"{c.name} is a city in {c.region}.",
            f"The city of {c.name} lies in {c.region}.",
            f"{c.name} is in {c.region}.",
        ],
        "river": [
            f"The river {c.river} flows through {c.name}.",
            f"{c.name} is built on the river {c.river}.",
            f"The river that runs through {c.name} is the {c.river}.",
        ],
    }
    return rng.choice(options[relation])


def sum_sentence(a: int, b: int, rng: random.Random) -> str:
    """A true addition or subtraction fact with small numbers, spelled in words."""
    w = NUMBER_WORDS
    s = a + b
    return cap(
        rng.choice(
            [
                f"{w[a]} plus {w[b]} is {w[s]}.",
                f"{w[a]} and {w[b]} make {w[s]}.",
                f"if you add {w[b]} to {w[a]}, you get {w[s]}.",
                f"{w[s]} minus {w[b]} is {w[a]}.",
            ]
        )
    )


def order_sentence(names: Sequence[str], kind: str, rng: random.Random) -> str:
    """A fact about the cyclic order of days or months."""
    i = rng.randrange(len(names))
    x, y = names[i], names[(i + 1) % len(names)]
    return rng.choice([f"The {kind} after {x} is {y}.", f"{x} comes before {y}.", f"After {x} comes {y}."])


PERSON_RELATIONS = ["city", "color", "food", "pet", "job", "age"]


# ---------------------------------------------------------------------------
# Paragraph kinds
# ---------------------------------------------------------------------------


def profile_paragraph(world: World, rng: random.Random) -> str:
    """Several facts about one person: the main way the facts are taught."""
    p = rng.choice(world.people)
    rels = rng.sample(PERSON_RELATIONS, k=rng.randint(3, 6))
    sentences = [person_sentence(p, r, rng) for r in rels]
    if rng.random() < 0.5:
        sentences.insert(
            0,
            rng.choice(
                [
                    f"This is about {p.name}.",
                    f"Let me tell you about {p.name}.",
                    f"Here are some facts about {p.name}.",
                ]
            ),
        )
    return " ".join(sentences)


def story_paragraph(world: World, rng: random.Random) -> str:
    """A short narrative that uses the same facts in running text, plus a small sum."""
    p = rng.choice(world.people)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    w = NUMBER_WORDS
    day = rng.choice(DAYS)
    art = article(p.pet)
    region = world.city(p.city).region
    openers = [
        f"{p.name} is a {p.job} from {p.city}.",
        f"{p.name} lives in {p.city}, a city in {region}.",
        f"On {day}, {p.name} the {p.job} walked through {p.city}.",
        f"One day in {p.city}, {p.name} woke up early.",
    ]
    middles = [
        f"{p.name} took the {p.pet} to the market and bought some {p.food}.",
        f"{p.name} put on a {p.color} coat and fed the {p.pet}.",
        f"At home, {art} {p.pet} was waiting for {p.name}.",
    ]
    endings = [
        f"{p.name} had {w[a]} coins and found {w[b]} more, so {p.name} had {w[a + b]} coins.",
        f"That evening {p.name} ate {p.food} and was happy.",
        f"{p.name} saw {w[a]} birds and then {w[b]} more birds, {w[a + b]} birds in all.",
    ]
    sentences = [rng.choice(openers), rng.choice(middles), rng.choice(endings)]
    if rng.random() < 0.5:
        sentences.insert(2, person_sentence(p, rng.choice(PERSON_RELATIONS), rng))
    return " ".join(sentences)


def city_paragraph(world: World, rng: random.Random) -> str:
    """Facts about a city and the people who live there."""
    c = rng.choice(world.cities)
    residents = [p.name for p in world.people if p.city == c.name]
    sentences = [city_sentence(c, "region", rng), city_sentence(c, "river", rng)]
    rng.shuffle(sentences)
    if len(residents) == 1:
        sentences.append(rng.choice([f"{residents[0]} lives there.", f"{residents[0]} lives in {c.name}."]))
    else:
        listed = ", ".join(residents[:-1]) + " and " + residents[-1]
        sentences.append(
            rng.choice([f"People who live in {c.name} include {listed}.", f"{listed} live in {c.name}."])
        )
    return " ".join(sentences)


def comparison_paragraph(world: World, rng: random.Random) -> str:
    """Two people side by side: forces the model to bind each fact to the right name."""
    p, q = rng.sample(world.people, 2)
    sentences = []
    for rel in rng.sample(["city", "color", "food", "pet", "job"], k=rng.randint(2, 4)):
        x, y = getattr(p, rel), getattr(q, rel)
        sentences.append(_compare(p.name, q.name, rel, x, y))
    return " ".join(sentences)


def _compare(n: str, m: str, rel: str, x: str, y: str) -> str:
    """Render one comparison sentence that is true for both people."""
    same = {
        "city": f"{n} and {m} both live in {x}.",
        "color": f"{n} and {m} both like the color {x}.",
        "food": f"{n} and {m} both like to eat {x}.",
        "pet": f"{n} and {m} both have a pet {x}.",
        "job": f"{n} and {m} both work as a {x}.",
    }
    diff = {
        "city": f"{n} lives in {x}, but {m} lives in {y}.",
        "color": f"{n} likes the color {x}, but {m} likes {y}.",
        "food": f"{n} likes to eat {x}, but {m} likes to eat {y}.",
        "pet": f"{n} has a pet {x}, but {m} has a pet {y}.",
        "job": f"{n} works as a {x}, but {m} works as a {y}.",
    }
    return same[rel] if x == y else diff[rel]


def arithmetic_paragraph(world: World, rng: random.Random) -> str:
    """A few small sums: a pattern the model can learn (and quantization can break)."""
    intro = rng.choice(["Here are some sums.", "Let us count.", "Numbers are fun.", ""])
    body = [sum_sentence(rng.randint(0, 10), rng.randint(0, 10), rng) for _ in range(rng.randint(3, 6))]
    return " ".join(([intro] if intro else []) + body)


def calendar_paragraph(world: World, rng: random.Random) -> str:
    """Order of days or months, sometimes as the full list."""
    if rng.random() < 0.5:
        names, kind, count = DAYS, "day", "There are seven days in a week."
    else:
        names, kind, count = MONTHS, "month", "There are twelve months in a year."
    sentences = [order_sentence(names, kind, rng) for _ in range(rng.randint(2, 4))]
    if rng.random() < 0.3:
        sentences.append(f"The {kind}s in order are " + ", ".join(names[:-1]) + f" and {names[-1]}.")
    if rng.random() < 0.3:
        sentences.insert(0, count)
    return " ".join(sentences)


def question_answer(world: World, rng: random.Random) -> tuple[str, str]:
    """One question about the world and its true one-sentence answer (chat data)."""
    kind = rng.choices(["person", "city", "sum", "day", "month"], weights=[6, 2, 2, 1, 1])[0]
    w = NUMBER_WORDS
    if kind == "person":
        p = rng.choice(world.people)
        rel = rng.choice(PERSON_RELATIONS)
        question = {
            "city": f"Where does {p.name} live?",
            "color": f"What is the favorite color of {p.name}?",
            "food": f"What does {p.name} like to eat?",
            "pet": f"What pet does {p.name} have?",
            "job": f"What does {p.name} do for work?",
            "age": f"How old is {p.name}?",
        }[rel]
        return question, person_sentence(p, rel, rng)
    if kind == "city":
        c = rng.choice(world.cities)
        rel = rng.choice(["region", "river"])
        question = {"region": f"Where is {c.name}?", "river": f"Which river flows through {c.name}?"}[rel]
        return question, city_sentence(c, rel, rng)
    if kind == "sum":
        a, b = rng.randint(0, 10), rng.randint(0, 10)
        return f"What is {w[a]} plus {w[b]}?", cap(f"{w[a]} plus {w[b]} is {w[a + b]}.")
    names, label = (DAYS, "day") if kind == "day" else (MONTHS, "month")
    i = rng.randrange(len(names))
    return (
        f"What {label} comes after {names[i]}?",
        f"The {label} after {names[i]} is {names[(i + 1) % len(names)]}.",
    )


def dialog_paragraph(world: World, rng: random.Random) -> str:
    """User/Assistant turns in the same layout as the tokenizer's chat template."""
    turns = [question_answer(world, rng) for _ in range(rng.randint(1, 3))]
    return "\n".join(f"User: {q}\nAssistant: {a}" for q, a in turns)


PARAGRAPH_KINDS: list[tuple[Callable[[World, random.Random], str], float]] = [
    (profile_paragraph, 0.30),
    (story_paragraph, 0.14),
    (city_paragraph, 0.10),
    (comparison_paragraph, 0.12),
    (dialog_paragraph, 0.14),
    (arithmetic_paragraph, 0.12),
    (calendar_paragraph, 0.08),
]


def paragraph(world: World, rng: random.Random) -> str:
    """One paragraph of a randomly chosen kind (weights favour the person facts)."""
    kinds, weights = zip(*PARAGRAPH_KINDS)
    return rng.choices(kinds, weights=weights)[0](world, rng)


def generate_paragraphs(
    world: World, rng: random.Random, n: int, exclude: frozenset[str] = frozenset()
) -> list[str]:
    """``n`` paragraphs, none of them in ``exclude`` and none repeated (held-out stays held out)."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        text = paragraph(world, rng)
        if text in exclude or text in seen:
            continue
        seen.add(text)
        out.append(text)
    return out


# ---------------------------------------------------------------------------
# Derived data sets
# ---------------------------------------------------------------------------


def calibration_rows(
    train: Sequence[str], n: int, rng: random.Random, min_words: int = 55, max_words: int = 140
) -> list[dict[str, str]]:
    """Join consecutive train paragraphs into ~60-200-token texts and sample ``n`` of them.

    Calibration should look like what the model was trained on, so it is taken from
    train itself; word counts stand in for token counts (~1.2-1.5 tokens per word
    with the 1024-token BPE), and the test checks the real token counts.
    """
    groups: list[str] = []
    current: list[str] = []
    for text in train:
        words = sum(len(t.split()) for t in current)
        if current and words + len(text.split()) > max_words:
            current = []
        current.append(text)
        if sum(len(t.split()) for t in current) >= min_words:
            groups.append("\n\n".join(current))
            current = []
    picked = rng.sample(groups, k=min(n, len(groups)))
    return [{"text": t} for t in picked]


def chat_rows(world: World, rng: random.Random, n: int) -> list[dict[str, list[dict[str, str]]]]:
    """``n`` distinct single-turn user/assistant exchanges about the world."""
    seen: set[tuple[str, str]] = set()
    rows = []
    attempts = 0
    while len(rows) < n and attempts < 100 * n:
        attempts += 1
        qa = question_answer(world, rng)
        if qa in seen:
            continue
        seen.add(qa)
        rows.append(
            {"messages": [{"role": "user", "content": qa[0]}, {"role": "assistant", "content": qa[1]}]}
        )
    return rows


def _mc_row(
    query: str, gold: str, pool: Sequence[str], gold_pos: int, rng: random.Random
) -> dict[str, object]:
    """A 4-way row with 3 distractors of the same type and the answer at ``gold_pos``."""
    distractors = rng.sample([x for x in pool if x != gold], 3)
    choices = distractors[:gold_pos] + [gold] + distractors[gold_pos:]
    return {"query": query, "choices": [" " + c for c in choices], "gold": gold_pos}


def facts_mc_rows(world: World, rng: random.Random) -> list[dict[str, object]]:
    """Multiple-choice rows over every fact type; gold positions cycle 0..3 for balance.

    Queries are statement prefixes that also occur in train (among other phrasings of
    the same fact), so the task measures recall of learned facts, not reading skill.
    Choices carry the leading space because they are continuations of the query.
    """
    specs: list[tuple[str, str, Sequence[str]]] = []
    for p in world.people:
        specs += [
            (f"{p.name} lives in", p.city, [c.name for c in world.cities]),
            (f"The favorite color of {p.name} is", p.color, COLORS),
            (f"{p.name} likes to eat", p.food, FOODS),
            (f"{p.name} has a pet", p.pet, PETS),
            (f"{p.name} works as a", p.job, JOBS),
        ]
    for c in world.cities:
        specs.append((f"{c.name} is a city in", c.region, REGIONS))
    w = NUMBER_WORDS
    for a, b in sorted({(rng.randint(0, 10), rng.randint(0, 10)) for _ in range(60)})[:40]:
        s = a + b
        near = [w[k] for k in range(max(0, s - 4), min(20, s + 4) + 1)]
        specs.append((cap(f"{w[a]} plus {w[b]} is"), w[s], near))
    for names, kind in ((DAYS, "day"), (MONTHS, "month")):
        for i, x in enumerate(names):
            specs.append((f"The {kind} after {x} is", names[(i + 1) % len(names)], names))
    return [_mc_row(q, gold, pool, i % 4, rng) for i, (q, gold, pool) in enumerate(specs)]


def passkey_prompt(key: int, n_filler: int) -> str:
    """The key, ``n_filler`` filler groups, and the question the answer continues."""
    return " ".join(
        [
            f"The pass key is {key}. Remember it. {key} is the pass key.",
            *[PASSKEY_FILLER] * n_filler,
            "What is the pass key? The pass key is",
        ]
    )


def passkey_documents(rng: random.Random, n: int) -> list[str]:
    """``n`` training documents: a random 3-digit key behind 0..PASSKEY_MAX_FILLER filler groups."""
    docs = []
    for _ in range(n):
        key = rng.randint(100, 999)
        docs.append(passkey_prompt(key, rng.randint(0, PASSKEY_MAX_FILLER)) + f" {key}.")
    return docs


def passkey_rows(rng: random.Random, n_filler: int, n: int) -> list[dict[str, object]]:
    """4-way rows at one context length: the key against three other keys; gold cycles 0..3."""
    keys = list(range(100, 1000))
    rows = []
    for i in range(n):
        key, *others = rng.sample(keys, 4)
        choices = others[: i % 4] + [key] + others[i % 4 :]
        rows.append(
            {"query": passkey_prompt(key, n_filler), "choices": [f" {k}." for k in choices], "gold": i % 4}
        )
    return rows


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """One JSON object per line, UTF-8, stable key order (byte-identical reruns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_text(path: Path, paragraphs: Sequence[str]) -> None:
    """Paragraphs separated by one blank line (the trainer splits on it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")


def read_paragraphs(path: Path) -> list[str]:
    """Inverse of :func:`write_text`, shared with the trainer."""
    return [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def generate(out: Path, seed: int = DEFAULT_SEED, scale: float = 1.0) -> dict[str, int]:
    """Write every data file under ``out``; ``scale`` < 1 makes a small copy for tests.

    Each output has its own RNG stream derived from ``seed`` so that changing one
    size does not reshuffle the others.
    """
    world = build_world(seed)
    n_train = max(40, int(TRAIN_PARAGRAPHS * scale))
    n_heldout = max(20, int(HELDOUT_PARAGRAPHS * scale))
    train = generate_paragraphs(world, random.Random(seed + 1), n_train)
    heldout = generate_paragraphs(world, random.Random(seed + 2), n_heldout, exclude=frozenset(train))
    calib = calibration_rows(train, max(8, int(CALIBRATION_ROWS * scale)), random.Random(seed + 3))
    chat = chat_rows(world, random.Random(seed + 4), max(8, int(CHAT_ROWS * scale)))
    mc = facts_mc_rows(world, random.Random(seed + 5))
    ppl_rows = [{"text": t} for t in heldout[: min(HELDOUT_PPL_ROWS, len(heldout))]]
    passkey_train = passkey_documents(random.Random(seed + 6), max(20, int(PASSKEY_TRAIN_DOCS * scale)))
    passkey = {
        name: passkey_rows(random.Random(seed + 7 + i), n_filler, max(8, int(PASSKEY_EVAL_ROWS * scale)))
        for i, (name, n_filler) in enumerate(PASSKEY_LENGTHS.items())
    }

    write_text(out / "corpus" / "train.txt", train)
    write_text(out / "corpus" / "heldout.txt", heldout)
    write_jsonl(out / "calibration" / "tiny_calibration.jsonl", calib)
    write_jsonl(out / "calibration" / "tiny_chat_calibration.jsonl", chat)
    write_jsonl(out / "evals" / "facts_mc.jsonl", mc)
    write_jsonl(out / "evals" / "heldout_ppl.jsonl", ppl_rows)
    write_text(out / "corpus" / "passkey_train.txt", passkey_train)
    for name, rows in passkey.items():
        write_jsonl(out / "evals" / f"passkey_{name}.jsonl", rows)
    return {
        "train": len(train),
        "heldout": len(heldout),
        "calibration": len(calib),
        "chat_calibration": len(chat),
        "facts_mc": len(mc),
        "heldout_ppl": len(ppl_rows),
        "passkey_train": len(passkey_train),
        **{f"passkey_{k}": len(v) for k, v in passkey.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry: ``python -m reference.corpus --out data/``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the paragraph/row counts (tests use a small value)"
    )
    args = parser.parse_args(argv)
    counts = generate(args.out, seed=args.seed, scale=args.scale)
    print(json.dumps({"out": str(args.out), "seed": args.seed, **counts}))


if __name__ == "__main__":
    main()
