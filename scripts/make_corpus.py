"""Generate the default demo corpus: two small, license-clean, synthetic domains.

    python scripts/make_corpus.py                 # writes data/corpus/ (deterministic)
    python scripts/make_corpus.py --check         # regenerate in memory, compare with data/corpus/

Domains (each one directory of JSON-lines shards with a ``"text"`` field):

- ``prose/``: short stories and encyclopedic articles built from templates over a vocabulary of a
  few hundred English words. The "world" is fixed: every animal always has the same color, food and
  home, every (invented) country always has the same capital, language and river, so a small model
  can learn facts as well as grammar.
- ``arithmetic/``: drills (``12 + 35 = 47``), question/answer pairs, multi-step expressions, column
  addition with carries, counting and comparisons. Every equation is computed, then re-checked by a
  parser before the file is written.

Layout: ``data/corpus/<domain>/train-0000.jsonl`` .. ``train-0003.jsonl`` and
``data/corpus/<domain>/validation-0000.jsonl``. Every document is unique within its domain, so no
validation document also appears in train.

All text is produced by this script (no copied text); the output is dedicated to the public domain
(CC0 1.0). The output depends only on the seed and the arguments: re-running writes byte-identical
files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "data" / "corpus"

# ---------------------------------------------------------------------------------------------
# The prose world. Everything here is fixed, so facts stay consistent across the whole corpus.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Animal:
    name: str
    plural: str
    size: str
    kind: str
    color: str
    home: str
    food: str
    baby: str
    sound: str
    legs: int


ANIMALS = [
    Animal("cat", "cats", "small", "mammal", "gray", "house", "fish", "kitten", "meows", 4),
    Animal("dog", "dogs", "friendly", "mammal", "brown", "house", "meat", "puppy", "barks", 4),
    Animal("cow", "cows", "large", "mammal", "black and white", "farm", "grass", "calf", "moos", 4),
    Animal("horse", "horses", "large", "mammal", "brown", "farm", "hay", "foal", "neighs", 4),
    Animal("sheep", "sheep", "gentle", "mammal", "white", "farm", "grass", "lamb", "bleats", 4),
    Animal("pig", "pigs", "round", "mammal", "pink", "farm", "corn", "piglet", "oinks", 4),
    Animal("goat", "goats", "small", "mammal", "white", "hill", "leaves", "kid", "bleats", 4),
    Animal("duck", "ducks", "small", "bird", "yellow", "pond", "seeds", "duckling", "quacks", 2),
    Animal("owl", "owls", "quiet", "bird", "brown", "forest", "mice", "owlet", "hoots", 2),
    Animal("robin", "robins", "small", "bird", "red and brown", "garden", "worms", "chick", "sings", 2),
    Animal("penguin", "penguins", "short", "bird", "black and white", "ice", "fish", "chick", "squawks", 2),
    Animal("frog", "frogs", "small", "amphibian", "green", "pond", "flies", "tadpole", "croaks", 4),
    Animal("bee", "bees", "tiny", "insect", "yellow and black", "garden", "nectar", "larva", "buzzes", 6),
    Animal("ant", "ants", "tiny", "insect", "black", "field", "seeds", "larva", "makes no sound", 6),
    Animal("fox", "foxes", "clever", "mammal", "red", "forest", "mice", "kit", "yips", 4),
    Animal("bear", "bears", "big", "mammal", "brown", "forest", "berries", "cub", "growls", 4),
    Animal("wolf", "wolves", "strong", "mammal", "gray", "forest", "meat", "pup", "howls", 4),
    Animal("lion", "lions", "big", "mammal", "golden", "grassland", "meat", "cub", "roars", 4),
    Animal("elephant", "elephants", "huge", "mammal", "gray", "grassland", "leaves", "calf", "trumpets", 4),
    Animal("rabbit", "rabbits", "small", "mammal", "white", "meadow", "carrots", "kit", "thumps", 4),
    Animal("mouse", "mice", "tiny", "mammal", "gray", "field", "seeds", "pup", "squeaks", 4),
    Animal("turtle", "turtles", "slow", "reptile", "green", "pond", "plants", "hatchling", "hisses", 4),
    Animal("snake", "snakes", "long", "reptile", "green", "grassland", "mice", "hatchling", "hisses", 0),
    Animal("whale", "whales", "huge", "mammal", "blue", "ocean", "krill", "calf", "sings", 0),
]

# Where one animal of each home lives, and where animals of that home live (plural).
LIVES_ONE = {
    "house": "in a warm house",
    "farm": "on a big farm",
    "hill": "on a green hill",
    "pond": "by a quiet pond",
    "forest": "in a deep forest",
    "garden": "in a sunny garden",
    "ice": "on the cold ice",
    "field": "in a wide field",
    "grassland": "in the dry grassland",
    "meadow": "in a bright meadow",
    "ocean": "in the deep ocean",
}
LIVES_MANY = {
    "house": "in houses with people",
    "farm": "on farms",
    "hill": "on hills",
    "pond": "in and near ponds",
    "forest": "in forests",
    "garden": "in gardens",
    "ice": "on the ice",
    "field": "in fields",
    "grassland": "in grasslands",
    "meadow": "in meadows",
    "ocean": "in the ocean",
}
# Where each food can be found.
FOOD_PLACE = {
    "fish": "river",
    "meat": "market",
    "grass": "meadow",
    "hay": "barn",
    "corn": "field",
    "leaves": "forest",
    "seeds": "field",
    "mice": "barn",
    "worms": "garden",
    "flies": "pond",
    "nectar": "garden",
    "berries": "forest",
    "carrots": "garden",
    "plants": "lake",
    "krill": "cold sea",
}


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    language: str
    river: str
    mountain: str
    side: str
    weather: str
    food: str
    animal: str
    craft: str


# Invented countries: nothing here is a real place, so nothing can be wrong about them.
COUNTRIES = [
    Country(
        "Ardonia", "Belmar", "Ardonian", "Silva", "Mount Tor", "north", "cold", "fish soup", "wolf", "boats"
    ),
    Country("Calvera", "Dunmore", "Calveran", "Oro", "Mount Lusk", "south", "warm", "rice", "lion", "cloth"),
    Country(
        "Estmark", "Fallow", "Estmarkish", "Grey", "Mount Ebb", "east", "rainy", "bread", "owl", "clocks"
    ),
    Country("Gorvia", "Halden", "Gorvian", "Tamm", "Mount Vey", "west", "windy", "cheese", "goat", "bells"),
    Country(
        "Ilandra", "Jorvik", "Ilandran", "Pell", "Mount Ash", "north", "snowy", "apples", "bear", "sleds"
    ),
    Country("Kestria", "Lumen", "Kestrian", "Sorrow", "Mount Kell", "south", "dry", "beans", "snake", "pots"),
    Country("Marova", "Nessa", "Marovan", "Blue", "Mount Orr", "east", "mild", "noodles", "duck", "paper"),
    Country("Norvale", "Ostra", "Norvalish", "Wend", "Mount Pike", "west", "foggy", "pies", "fox", "rope"),
    Country(
        "Pelmora", "Quell", "Pelmoran", "Amber", "Mount Rook", "south", "hot", "melons", "elephant", "rugs"
    ),
    Country(
        "Rivenna", "Solace", "Rivennan", "Cress", "Mount Hale", "north", "cool", "oats", "horse", "saddles"
    ),
    Country("Tavaro", "Umber", "Tavaran", "Lark", "Mount Dray", "east", "sunny", "figs", "bee", "honey"),
    Country(
        "Velmont", "Wyre", "Velmontish", "Fenn", "Mount Cask", "west", "stormy", "potatoes", "whale", "nets"
    ),
]

GIRLS = ["Mila", "Lily", "Anna", "Rosa", "Nora", "Ella", "Ivy", "Zoe", "Lena", "Maya", "Ada", "Ruby", "Iris"]
GIRLS += ["June", "Vera", "Tara", "Sofia", "Hana", "Clara", "Lucy"]
BOYS = ["Tom", "Ben", "Sam", "Leo", "Max", "Finn", "Jack", "Omar", "Hugo", "Theo", "Noah", "Eli", "Otto"]
BOYS += ["Kai", "Milo", "Ravi", "Paul", "Adam", "Luca", "Oscar"]
COLORS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple", "brown", "pink"]
OBJECTS = ["ball", "kite", "hat", "book", "key", "cup", "boat", "drum", "scarf", "box", "bell", "map"]
OBJECTS += ["shoe", "lamp", "coat", "bag"]
PLACES = ["park", "garden", "river", "market", "school", "beach", "hill", "farm", "village", "library"]
PLACES += ["forest", "lake"]
SPOTS = ["under the bed", "behind the door", "in the grass", "near the big tree", "on the shelf"]
SPOTS += ["inside the old box", "under the table", "by the window", "in the kitchen", "next to the chair"]
FRUITS = ["apple", "pear", "plum", "cookie", "egg", "carrot", "banana", "lemon", "muffin", "peach"]
MEALS = ["bread", "soup", "cake", "cheese", "rice", "pie", "jam", "honey"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
NUMBER_WORDS += ["eleven", "twelve"]
TIMES = ["morning", "afternoon", "evening", "day"]
ACTIVITIES = {
    "park": ["played with a ball", "ran on the grass", "sat on a bench", "fed the ducks"],
    "garden": ["watered the flowers", "picked some beans", "looked at the bees", "dug a small hole"],
    "river": ["threw stones into the water", "watched the fish", "sat on the bank", "built a little dam"],
    "market": ["bought some fruit", "looked at the stalls", "talked to the baker", "counted coins"],
    "school": ["read a book", "drew a picture", "sang a song", "learned new words"],
    "beach": ["built a sand castle", "looked for shells", "swam in the sea", "ran by the waves"],
    "hill": ["flew a kite", "rolled down the grass", "looked at the village", "picked flowers"],
    "farm": ["fed the animals", "helped the farmer", "rode on a cart", "collected eggs"],
    "village": ["visited a friend", "walked down the street", "saw the old well", "rang the bell"],
    "library": ["read a story", "found a book about animals", "sat very quietly", "looked at maps"],
    "forest": ["walked under the trees", "heard a bird sing", "found a mushroom", "picked berries"],
    "lake": ["skipped stones", "watched the swans", "sat on the dock", "rowed a small boat"],
}
WEATHER_LINE = {
    "sunny": "The sky was blue and the sun was warm.",
    "rainy": "Rain fell all day, so {they} wore coats and boots.",
    "windy": "The wind was strong and the trees moved from side to side.",
    "snowy": "Snow covered the ground, so {they} wore warm hats.",
    "cloudy": "The sky was gray, but it did not rain.",
}
FEELINGS_BAD = ["sad", "worried", "upset"]
FEELINGS_GOOD = ["happy", "glad", "proud"]
MORALS = [
    "Friends help each other.",
    "It is good to ask for help.",
    "Sharing makes everyone happy.",
    "Being kind is always a good idea.",
    "Never give up.",
    "A good friend is a great gift.",
]
LEG_WORDS = {0: "no legs", 2: "two legs", 4: "four legs", 6: "six legs"}


def article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def cap(s: str) -> str:
    return s[0].upper() + s[1:]


def plural(word: str) -> str:
    if word.endswith(("ch", "sh", "s", "x")):
        return word + "es"
    return word + "s"


def count_phrase(n: int, noun: str) -> str:
    return f"{NUMBER_WORDS[n]} {noun if n == 1 else plural(noun)}"


@dataclass(frozen=True)
class Person:
    name: str
    he: str
    his: str
    him: str


def person(rng: random.Random, exclude: tuple[str, ...] = ()) -> Person:
    while True:
        if rng.random() < 0.5:
            p = Person(rng.choice(GIRLS), "she", "her", "her")
        else:
            p = Person(rng.choice(BOYS), "he", "his", "him")
        if p.name not in exclude:
            return p


def story_lost_object(rng: random.Random) -> str:
    a = person(rng)
    b = person(rng, (a.name,))
    color, obj, place = rng.choice(COLORS), rng.choice(OBJECTS), rng.choice(PLACES)
    s1, s2, s3 = rng.sample(SPOTS, 3)
    bad, good = rng.choice(FEELINGS_BAD), rng.choice(FEELINGS_GOOD)
    lines = [
        f"{a.name} had {article(color)} {color} {obj}. {cap(a.he)} loved the {obj} very much.",
        f"One {rng.choice(TIMES)}, {a.name} went to the {place} with the {obj}.",
        f"At the {place}, {a.name} {rng.choice(ACTIVITIES[place])}.",
        f"When {a.he} came home, the {obj} was gone! {a.name} felt {bad}.",
        f"{cap(a.he)} looked {s1} and {s2}, but {a.he} could not find it.",
        f"Then {a.his} friend {b.name} came to help. {b.name} looked {s3} and found the {color} {obj}.",
        f'"Thank you, {b.name}!" said {a.name}. {a.name} was {good} again.',
    ]
    if rng.random() < 0.5:
        lines.append(rng.choice(MORALS))
    return " ".join(lines)


def story_hungry_animal(rng: random.Random) -> str:
    a, b = rng.sample(ANIMALS, 2)
    hero = rng.choice(GIRLS + BOYS)
    he, his = ("she", "her") if hero in GIRLS else ("he", "his")
    place = FOOD_PLACE[a.food]
    lines = [
        f"Once upon a time, there was a little {a.name} named {hero}.",
        f"{hero} lived {LIVES_ONE[a.home]}. Like every {a.name}, {hero} liked to eat {a.food}.",
        f"One day, {hero} was very hungry, but there was no {a.food} near {his} home.",
        f"{hero} met {article(b.name)} {b.name}. The {b.name} {b.sound}.",
        f'"Where can I find {a.food}?" asked {hero}.',
        f'"Go to the {place}," said the {b.name}. "You will find {a.food} there."',
        f"So {hero} went to the {place} and found a lot of {a.food}. {hero} ate until {he} was full.",
    ]
    if rng.random() < 0.6:
        lines.append(f"Then {he} brought some {a.food} home and thanked the {b.name}.")
        lines.append(f"The {a.name} and the {b.name} became good friends.")
    else:
        lines.append(f"After that, {hero} always remembered the way to the {place}.")
    return " ".join(lines)


def story_weather_day(rng: random.Random) -> str:
    a = person(rng)
    b = person(rng, (a.name,))
    weather = rng.choice(sorted(WEATHER_LINE))
    place, color = rng.choice(PLACES), rng.choice(COLORS)
    act1, act2 = rng.sample(ACTIVITIES[place], 2)
    meal = rng.choice(MEALS)
    if meal in ("cheese", "jam", "honey"):
        food = f"{meal} sandwiches"
        packed = f"{a.name} made {food}"
    else:
        food = meal
        packed = f"{a.name} packed some {meal}"
    lines = [
        f"It was a {weather} {rng.choice(TIMES)}. {a.name} and {b.name} wanted to go to the {place}.",
        WEATHER_LINE[weather].format(they="they"),
        f"{packed}, and {b.name} took {article(color)} {color} bag.",
        f"At the {place}, they {act1}. Then they {act2}.",
        f"After a while, they were tired. They sat down and ate the {food}.",
        "When the sun went down, they walked home together.",
        f'"That was a good day," said {b.name}.',
    ]
    return " ".join(lines)


def story_counting(rng: random.Random) -> str:
    a = person(rng)
    b = person(rng, (a.name,))
    fruit = rng.choice(FRUITS)
    have = rng.randint(3, 9)
    give = rng.randint(1, have - 1)
    left = have - give
    more = rng.randint(1, 12 - left)
    total = left + more
    more_phrase = f"{NUMBER_WORDS[more]} more {plural(fruit) if more > 1 else fruit}"
    lines = [
        f"{a.name} had {count_phrase(have, fruit)} in a basket.",
        f"{cap(a.he)} gave {count_phrase(give, fruit)} to {b.name}.",
        f"Now {a.name} had {count_phrase(left, fruit)}.",
        f"Later, {a.his} mother gave {a.him} {more_phrase}.",
        f"So {a.name} had {count_phrase(total, fruit)} in the end.",
        f"{b.name} ate {b.his} {fruit if give == 1 else plural(fruit)} and said thank you.",
    ]
    return " ".join(lines)


def story_trip(rng: random.Random) -> str:
    a = person(rng)
    c = rng.choice(COUNTRIES)
    animal = next(x for x in ANIMALS if x.name == c.animal)
    lines = [
        f"{a.name} went on a trip to {c.name}. {c.name} is in the {c.side}.",
        f"First, {a.he} visited {c.capital}, the capital of {c.name}.",
        f"The people there speak {c.language}, so {a.name} learned to say hello in {c.language}.",
        f"The weather in {c.name} is {c.weather}. {a.name} walked along the {c.river} River.",
        f"{cap(a.he)} ate {c.food}, a favorite food in {c.name}.",
        f"{cap(a.he)} even saw {article(animal.name)} {animal.name}, the animal of {c.name}.",
        f"Before going home, {a.name} bought some {c.craft}, because {c.name} is famous for {c.craft}.",
    ]
    return " ".join(lines)


def article_country(rng: random.Random) -> str:
    c = rng.choice(COUNTRIES)
    facts = [
        f"The capital of {c.name} is {c.capital}.",
        f"People in {c.name} speak {c.language}.",
        f"The longest river in {c.name} is the {c.river} River.",
        f"The highest mountain in {c.name} is {c.mountain}.",
        f"The weather in {c.name} is {c.weather} most of the year.",
        f"People in {c.name} like to eat {c.food}.",
        f"The national animal of {c.name} is the {c.animal}.",
        f"{c.name} is famous for its {c.craft}.",
    ]
    body = [facts[0], *rng.sample(facts[1:], rng.randint(4, len(facts) - 1))]
    closing = rng.choice(
        [
            f"{c.capital} is the largest city in {c.name}.",
            f"Many people visit {c.capital} every year.",
            f"In summary, {c.name} is a country in the {c.side} with its capital at {c.capital}.",
        ]
    )
    return " ".join([f"{c.name} is a country in the {c.side}.", *body, closing])


def article_animal(rng: random.Random) -> str:
    a = rng.choice(ANIMALS)
    p = cap(a.plural)
    facts = [
        f"Most {a.plural} are {a.color}.",
        f"{p} live {LIVES_MANY[a.home]}.",
        f"{p} eat {a.food}.",
        f"A baby {a.name} is called {article(a.baby)} {a.baby}.",
        f"{cap(article(a.name))} {a.name} has {LEG_WORDS[a.legs]}.",
        f"{cap(article(a.name))} {a.name} {a.sound}.",
    ]
    body = rng.sample(facts, rng.randint(4, len(facts)))
    head = f"The {a.name} is {article(a.size)} {a.size} {a.kind}."
    return " ".join([head, *body])


def qa_quiz(rng: random.Random) -> str:
    items: list[str] = []
    for _ in range(rng.randint(4, 7)):
        if rng.random() < 0.5:
            c = rng.choice(COUNTRIES)
            q, ans = rng.choice(
                [
                    (f"What is the capital of {c.name}?", f"The capital of {c.name} is {c.capital}."),
                    (
                        f"What language do people speak in {c.name}?",
                        f"People in {c.name} speak {c.language}.",
                    ),
                    (f"Which river flows through {c.name}?", f"The {c.river} River flows through {c.name}."),
                    (
                        f"{c.capital} is the capital of which country?",
                        f"{c.capital} is the capital of {c.name}.",
                    ),
                ]
            )
        else:
            a = rng.choice(ANIMALS)
            q, ans = rng.choice(
                [
                    (f"What does {article(a.name)} {a.name} eat?", f"{cap(a.plural)} eat {a.food}."),
                    (
                        f"What is a baby {a.name} called?",
                        f"A baby {a.name} is called {article(a.baby)} {a.baby}.",
                    ),
                    (f"What color is {article(a.name)} {a.name}?", f"Most {a.plural} are {a.color}."),
                    (
                        f"How many legs does {article(a.name)} {a.name} have?",
                        f"{cap(article(a.name))} {a.name} has {LEG_WORDS[a.legs]}.",
                    ),
                ]
            )
        items.append(f"Question: {q}\nAnswer: {ans}")
    return "\n".join(items)


PROSE_KINDS: list[tuple[Callable[[random.Random], str], int]] = [
    (story_lost_object, 4),
    (story_hungry_animal, 4),
    (story_weather_day, 3),
    (story_counting, 2),
    (story_trip, 2),
    (article_country, 2),
    (article_animal, 2),
    (qa_quiz, 2),
]


def prose_doc(rng: random.Random) -> str:
    fns, weights = zip(*PROSE_KINDS, strict=True)
    return rng.choices(fns, weights=weights)[0](rng)


# ---------------------------------------------------------------------------------------------
# Arithmetic. Numbers are computed, never typed; `check_arithmetic` re-verifies every equation.
# ---------------------------------------------------------------------------------------------


def _binary(rng: random.Random, hard: bool = False) -> tuple[str, int]:
    op = rng.choice("+-*/")
    hi = 999 if hard else 99
    if op == "+":
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        return f"{a} + {b}", a + b
    if op == "-":
        a, b = sorted((rng.randint(0, hi), rng.randint(0, hi)), reverse=True)
        return f"{a} - {b}", a - b
    if op == "*":
        a, b = rng.randint(0, 99 if hard else 12), rng.randint(0, 12)
        return f"{a} * {b}", a * b
    b, q = rng.randint(1, 12), rng.randint(0, 99 if hard else 12)
    return f"{b * q} / {b}", q


def arith_drill(rng: random.Random) -> str:
    hard = rng.random() < 0.4
    lines = []
    for _ in range(rng.randint(12, 24)):
        expr, val = _binary(rng, hard)
        lines.append(f"{expr} = {val}")
    return "\n".join(lines)


def arith_qa(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(6, 10)):
        expr, val = _binary(rng, rng.random() < 0.5)
        lines.append(f"Q: What is {expr}?\nA: {expr} = {val}")
    return "\n".join(lines)


def arith_multistep(rng: random.Random) -> str:
    blocks = []
    for _ in range(rng.randint(3, 5)):
        a, b, c = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 9)
        op1 = rng.choice("+-")
        if op1 == "-" and a < b:
            a, b = b, a
        inner = a + b if op1 == "+" else a - b
        if rng.random() < 0.5:
            total = inner * c
            expr = f"({a} {op1} {b}) * {c}"
            steps = [f"{a} {op1} {b} = {inner}", f"{inner} * {c} = {total}"]
        else:
            total = inner + c
            expr = f"({a} {op1} {b}) + {c}"
            steps = [f"{a} {op1} {b} = {inner}", f"{inner} + {c} = {total}"]
        blocks.append("\n".join([f"Compute {expr}.", *steps, f"So {expr} = {total}."]))
    return "\n\n".join(blocks)


def arith_column(rng: random.Random) -> str:
    blocks = []
    places = ["Ones", "Tens", "Hundreds", "Thousands"]
    for _ in range(rng.randint(1, 2)):
        digits = rng.randint(2, 3)
        a, b = (
            rng.randint(10 ** (digits - 1), 10**digits - 1),
            rng.randint(10 ** (digits - 1), 10**digits - 1),
        )
        lines = [f"Add {a} and {b}."]
        carry = 0
        da, db = str(a)[::-1], str(b)[::-1]
        for i in range(digits):
            x, y = int(da[i]), int(db[i])
            s = x + y + carry
            terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
            carry, write = divmod(s, 10)
            note = f"write {write}, carry {carry}" if carry else f"write {write}"
            lines.append(f"{places[i]}: {terms} = {s}, {note}.")
        if carry:
            lines.append(f"{places[digits]}: write {carry}.")
        lines.append(f"Answer: {a} + {b} = {a + b}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def arith_counting(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(2, 3)):
        step, start = rng.randint(2, 12), rng.randint(0, 20)
        seq = [start + step * i for i in range(rng.randint(6, 10))]
        lines.append(f"Count by {step} from {start}: " + ", ".join(map(str, seq)))
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        sign = "<" if a < b else ">" if a > b else "="
        lines.append(f"{a} {sign} {b}")
    for _ in range(rng.randint(2, 4)):
        a = rng.randint(1, 12)
        lines.append(f"{a} * {a} = {a * a}")
    return "\n".join(lines)


ARITH_KINDS: list[tuple[Callable[[random.Random], str], int]] = [
    (arith_drill, 4),
    (arith_qa, 3),
    (arith_multistep, 3),
    (arith_column, 2),
    (arith_counting, 2),
]


def arith_doc(rng: random.Random) -> str:
    fns, weights = zip(*ARITH_KINDS, strict=True)
    return rng.choices(fns, weights=weights)[0](rng)


_EQ = re.compile(r"(\(?\d+ [-+*/] \d+\)?(?: [-+*/] \d+)?) = (\d+)")
_CMP = re.compile(r"^(\d+) ([<>=]) (\d+)$", re.MULTILINE)


def check_arithmetic(text: str) -> int:
    """Re-verify every equation and comparison in `text`; returns how many were checked."""
    n = 0
    for m in _EQ.finditer(text):
        expr, want = m.group(1), int(m.group(2))
        if not re.fullmatch(r"[\d ()+\-*/]+", expr):
            raise AssertionError(f"unexpected expression {expr!r}")
        got = eval(expr.replace("/", "//"), {"__builtins__": {}})  # digits and operators only
        if "/" in expr:
            x, y = (int(t) for t in expr.split(" / "))
            assert x % y == 0, expr
        assert got == want, f"{expr} = {want} is wrong (should be {got})"
        n += 1
    for m in _CMP.finditer(text):
        a, sign, b = int(m.group(1)), m.group(2), int(m.group(3))
        assert {"<": a < b, ">": a > b, "=": a == b}[sign], m.group(0)
        n += 1
    for m in re.finditer(r"Count by (\d+) from (\d+): ([\d, ]+)", text):
        step, start = int(m.group(1)), int(m.group(2))
        seq = [int(t) for t in m.group(3).split(", ")]
        assert seq == [start + step * i for i in range(len(seq))], m.group(0)
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Writing shards.
# ---------------------------------------------------------------------------------------------

DOMAINS: dict[str, Callable[[random.Random], str]] = {"prose": prose_doc, "arithmetic": arith_doc}


def build_domain(domain: str, seed: int, train_shards: int, docs_per_shard: int, val_docs: int):
    """Return {filename: [documents]} for one domain. Documents are unique across all splits."""
    gen = DOMAINS[domain]
    # String seeds are hashed with SHA-512 by `random` (version 2): stable across runs and platforms.
    rng = random.Random(f"drydock-corpus/{domain}/{seed}")
    seen: set[str] = set()
    plan = [(f"train-{i:04d}.jsonl", docs_per_shard) for i in range(train_shards)]
    plan.append(("validation-0000.jsonl", val_docs))
    files: dict[str, list[str]] = {}
    for fname, n in plan:
        docs: list[str] = []
        misses = 0
        while len(docs) < n:
            text = gen(rng)
            if text in seen:
                misses += 1
                if misses > 100 * n:
                    raise RuntimeError(f"{domain}: generator too repetitive")
                continue
            seen.add(text)
            docs.append(text)
        files[fname] = docs
    return files


def render(domain: str, fname: str, docs: list[str]) -> bytes:
    split = fname.removesuffix(".jsonl")
    lines = [
        json.dumps({"id": f"{domain}/{split}/{i:05d}", "text": text}, ensure_ascii=True, sort_keys=True)
        for i, text in enumerate(docs)
    ]
    return ("\n".join(lines) + "\n").encode("ascii")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: data/corpus)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-shards", type=int, default=4)
    ap.add_argument("--docs-per-shard", type=int, default=500, help="documents per train shard")
    ap.add_argument("--val-docs", type=int, default=200, help="documents in the validation shard")
    ap.add_argument("--check", action="store_true", help="compare with files on disk instead of writing")
    args = ap.parse_args(argv)

    mismatches = []
    total_bytes = 0
    print(f"{'file':46s} {'docs':>6s} {'bytes':>9s} {'chars/doc':>9s}")
    for domain in DOMAINS:
        files = build_domain(domain, args.seed, args.train_shards, args.docs_per_shard, args.val_docs)
        ddir = args.out / domain
        if domain == "arithmetic":
            checked = sum(check_arithmetic(d) for docs in files.values() for d in docs)
            print(f"arithmetic: verified {checked} equations, comparisons and sequences")
        if not args.check:
            ddir.mkdir(parents=True, exist_ok=True)
            for stale in sorted(ddir.glob("*.jsonl")):
                if stale.name not in files:
                    stale.unlink()
        for fname, docs in files.items():
            data = render(domain, fname, docs)
            path = ddir / fname
            if args.check:
                if not path.is_file() or path.read_bytes() != data:
                    mismatches.append(str(path))
            else:
                path.write_bytes(data)
            total_bytes += len(data)
            rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            avg = sum(len(d) for d in docs) / len(docs)
            digest = hashlib.sha256(data).hexdigest()[:12]
            print(f"{rel!s:46s} {len(docs):6d} {len(data):9d} {avg:9.0f}  sha256:{digest}")
    print(f"total: {total_bytes} bytes ({total_bytes / 1e6:.2f} MB)")
    if mismatches:
        print("differs from the generator output: " + ", ".join(mismatches), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
