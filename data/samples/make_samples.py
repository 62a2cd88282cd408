"""Make the embedded sample sources: one JSONL file per dataset, in that dataset's real schema.

    python data/samples/make_samples.py [--out DIR]   # rewrites data/samples/*.jsonl and quirks.json

Seeded and deterministic: running it twice gives identical bytes. Answers come from small templates with slots
(numbers, names, cities, functions), so a ~10M-parameter target trained for minutes on a CPU can learn them, and a
drafter can then learn the target. Deliberate quirks (duplicates, near-duplicates, shared system prompts, broken
rows) are inserted at seeded positions and their 1-based line numbers written to ``quirks.json``; README.md says why.
More rows, with content the first ones lack, are appended after the quirks from their own rng ("appended rows"), so
that the sources hold enough distinct prompts without moving any earlier line. Standard library only, so it runs
before anything is installed.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import uuid
from dataclasses import dataclass, field
from math import gcd
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
SEED = 20240601

NAMES = ["Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam",
         "Maya", "Noah", "Olga", "Pedro", "Rosa", "Sam", "Tara", "Victor"]
ITEMS = ["apple", "pencil", "marble", "sticker", "book", "cookie", "card", "shell", "coin", "flower", "stamp", "toy car"]
CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Toronto", "Sydney", "Berlin", "Madrid", "Seoul", "Nairobi",
          "Denver", "Lisbon", "Dublin", "Mumbai", "Chicago"]
DATES = ["2024-05-%02d" % d for d in range(1, 29)]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "partly cloudy"]
CUISINES = ["Italian", "Japanese", "Mexican", "Indian", "Thai", "Greek", "French"]
PLACE_WORDS = ["Garden", "Corner", "House", "Table", "Kitchen", "Bistro", "Spoon", "Lantern"]
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "TSLA", "NVDA", "IBM", "ORCL"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CAD", "CHF"]
TOPICS = ["technology", "sports", "science", "health", "business", "travel"]

CONCEPTS = [  # term, definition, example
    ("photosynthesis", "the process plants use to turn sunlight, water and carbon dioxide into sugar and oxygen",
     "a green leaf making food on a sunny day"),
    ("gravity", "the force that pulls objects with mass toward each other", "an apple falling from a tree"),
    ("inflation", "the general rise of prices over time, which lowers what money can buy",
     "bread costing more this year than last year"),
    ("evaporation", "the change of a liquid into a gas when it is heated", "a puddle drying in the sun"),
    ("an algorithm", "a finite list of steps that solves a problem", "a recipe for baking a cake"),
    ("a variable", "a named place in a program that holds a value", "a box labeled score that holds the number 10"),
    ("democracy", "a system of government in which citizens choose their leaders by voting",
     "people electing a mayor"),
    ("an ecosystem", "a community of living things together with the place they live in", "a pond with fish, frogs and plants"),
    ("friction", "the force that slows down objects sliding against each other", "a bike slowing down when you brake"),
    ("a fraction", "a number that describes a part of a whole", "one half of a pizza"),
    ("recursion", "a way of solving a problem by having a function call itself on a smaller input",
     "computing a factorial from the factorial of a smaller number"),
    ("compound interest", "interest earned on both the original money and the interest already added",
     "savings that grow faster every year"),
]
CONCEPTS_ZH = [
    ("光合作用", "植物利用阳光、水和二氧化碳制造糖和氧气的过程"),
    ("重力", "使有质量的物体互相吸引的力"),
    ("通货膨胀", "物价随时间普遍上涨，使同样的钱能买到的东西变少"),
    ("算法", "解决问题的一系列有限步骤"),
    ("蒸发", "液体受热变成气体的过程"),
    ("生态系统", "生物和它们生活的环境组成的整体"),
]
PAIRS = [  # a, b, field, what a does, what b does
    ("list", "tuple", "Python", "can be changed after it is created", "cannot be changed after it is created"),
    ("process", "thread", "operating systems", "has its own memory space", "shares memory with other threads of its process"),
    ("stack", "queue", "computer science", "removes the last item added first", "removes the first item added first"),
    ("compiler", "interpreter", "programming", "translates the whole program before it runs",
     "runs the program one statement at a time"),
    ("mean", "median", "statistics", "is the sum of the values divided by their count",
     "is the middle value when the values are sorted"),
    ("weather", "climate", "geography", "describes conditions over hours or days", "describes the average conditions over many years"),
    ("virus", "bacterium", "biology", "needs a host cell to reproduce", "can reproduce on its own"),
    ("speed", "velocity", "physics", "tells how fast something moves", "tells how fast and in which direction something moves"),
]
GOALS = {
    "sleeping better": ["Go to bed at the same time every night.", "Keep your bedroom dark and cool.",
                        "Avoid screens for an hour before bed.", "Skip coffee after lunch.", "Get some sunlight in the morning."],
    "studying for an exam": ["Study in short sessions with breaks.", "Test yourself instead of rereading.",
                             "Start a week early, not the night before.", "Explain the topic out loud.", "Sleep well before the exam."],
    "saving money": ["Write down what you spend each week.", "Set a fixed amount aside on payday.",
                     "Cook at home more often.", "Cancel subscriptions you do not use.", "Wait a day before big purchases."],
    "learning a language": ["Practice a little every day.", "Learn the most common words first.",
                            "Listen to simple podcasts.", "Speak with native speakers early.", "Keep a small notebook of new phrases."],
    "staying focused at work": ["Make a short list of tasks each morning.", "Turn off notifications for an hour.",
                                "Do the hardest task first.", "Take a five-minute break every hour.", "Keep your desk tidy."],
}
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a concise tutor. Answer in a few sentences.",
                  "You are a friendly assistant that explains things simply."]
LABELS = {
    "math": ("mathematical calculation", "数学计算", "mathematical ability", "数学能力"),
    "code": ("programming ability", "编程能力", "programming and software development", "编程与软件开发"),
    "explain": ("knowledge question and answer", "知识问答", "open knowledge q&a", "开放知识问答"),
    "tips": ("suggestion generation", "建议生成", "problem solving and support", "问题解答与支持"),
}
TINY_PNG = "data:image/png;base64," + base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a1b7e6e20000000049454e44ae426082")).decode()


def pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


def words(text: str) -> int:
    return len(text.split())


# ------------------------------------------------------------------ math (MetaMathQA, WebInstruct, traces)

@dataclass
class Gsm:
    """One grade-school template: question, rephrasing, solution, and the equation for the unknown x."""

    question: str
    rephrased: str
    steps: str
    ans: Callable[[int, int], int]
    expr: str  # the left side with x in place of a
    inverse: str  # how x is recovered from the answer


GSM = [
    Gsm("{name} has {a} {item}s and buys {b} more. How many {item}s does {name} have now?",
        "If {name} started with {a} {item}s and then bought {b} more, how many {item}s does {name} have?",
        "{name} starts with {a} {item}s.\nAfter buying {b} more, {name} has {a} + {b} = {ans} {item}s.",
        lambda a, b: a + b, "x + {b}", "{ans} - {b}"),
    Gsm("{name} buys {a} boxes of {item}s. Each box holds {b} {item}s. How many {item}s does {name} buy in total?",
        "How many {item}s does {name} get by buying {a} boxes with {b} {item}s in each box?",
        "Each box holds {b} {item}s.\nSo {a} boxes hold {a} * {b} = {ans} {item}s.",
        lambda a, b: a * b, "x * {b}", "{ans} / {b}"),
    Gsm("{name} had {a} {item}s and gave {b} of them to a friend. How many {item}s does {name} have left?",
        "After giving {b} of {name}'s {a} {item}s to a friend, how many {item}s remain?",
        "{name} had {a} {item}s and gave away {b}.\nSo {name} has {a} - {b} = {ans} {item}s left.",
        lambda a, b: a - b, "x - {b}", "{ans} + {b}"),
    Gsm("{name} buys {a} {item}s for ${b} each. How much money does {name} spend?",
        "What is the total amount {name} spends on {a} {item}s that cost ${b} each?",
        "Each {item} costs ${b}.\nSo {a} {item}s cost {a} * ${b} = ${ans}.",
        lambda a, b: a * b, "x * {b}", "{ans} / {b}"),
]


def gsm_slots(rng: random.Random, t: int) -> dict[str, Any]:
    a, b = rng.randint(3, 60), rng.randint(2, 12)
    if t == 2:
        a = b + rng.randint(1, 50)
    s = {"name": pick(rng, NAMES), "item": pick(rng, ITEMS), "a": a, "b": b}
    s["ans"] = GSM[t].ans(a, b)
    return s


def gsm_response(t: int, s: dict[str, Any]) -> str:
    return GSM[t].steps.format(**s) + f"\n#### {s['ans']}\nThe answer is: {s['ans']}"


def gsm_unknown(t: int, s: dict[str, Any], fobar: bool) -> tuple[str, str]:
    """SV and FOBAR variants: the first number becomes x and the answer is given; solve for x."""
    g = GSM[t]
    q = g.question.format(**{**s, "a": "x"})
    if fobar:
        q += f"\nIf we know the answer to the above question is {s['ans']}, what is the value of unknown variable x?"
    else:
        q = q.rstrip("?") + f"? The answer is {s['ans']}. What is the value of unknown variable x?"
    lhs = g.expr.format(**s)
    r = (g.steps.format(**{**s, "a": "x", "ans": lhs}).split("=")[0].rstrip()
         + f".\nWe know that the result is {s['ans']}, so we can write: {lhs} = {s['ans']}.\n"
         + f"Solving for x, we get: x = {g.inverse.format(**s)} = {s['a']}.\n"
         + f"The value of x is {s['a']}.\n#### {s['a']}\nThe answer is: {s['a']}")
    return q, r


def math_problem(rng: random.Random) -> tuple[str, str, str]:
    """A MATH-style problem: (question, rephrased question, response)."""
    k = rng.randrange(3)
    if k == 0:
        a, b, c = rng.randint(2, 15), rng.randint(2, 15), rng.randint(1, 40)
        r = a * b + c
        return (f"What is the value of ${a} \\times {b} + {c}$?",
                f"Compute ${a} \\times {b} + {c}$.",
                f"First multiply: ${a} \\times {b} = {a * b}$.\nThen add {c}: ${a * b} + {c} = {r}$.\n"
                f"So the value is $\\boxed{{{r}}}$.\nThe answer is: {r}")
    if k == 1:
        a, y, b = rng.randint(2, 9), rng.randint(1, 20), rng.randint(1, 30)
        c = a * y + b
        return (f"Solve for $y$: ${a}y + {b} = {c}$.",
                f"Find $y$ if ${a}y + {b} = {c}$.",
                f"Subtract {b} from both sides: ${a}y = {c - b}$.\nDivide both sides by {a}: $y = {y}$.\n"
                f"So $y = \\boxed{{{y}}}$.\nThe answer is: {y}")
    g = rng.randint(2, 12)
    p, q = pick(rng, [(2, 3), (3, 4), (4, 5), (2, 5), (3, 5), (5, 6), (3, 7)])
    a, b = g * p, g * q
    return (f"What is the greatest common divisor of {a} and {b}?",
            f"Find the greatest common factor of {a} and {b}.",
            f"We write {a} = {g} * {p} and {b} = {g} * {q}.\nSince {p} and {q} share no common factor, "
            f"the greatest common divisor is $\\boxed{{{gcd(a, b)}}}$.\nThe answer is: {gcd(a, b)}")


# ------------------------------------------------------------------ short explanations (WebInstruct, Infinity)

def explain(rng: random.Random) -> tuple[str, str, tuple]:
    c = pick(rng, CONCEPTS)
    term, definition, example = c
    q = pick(rng, ["Explain {t} in simple terms.", "What is {t}?", "Can you explain what {t} means?",
                   "Describe {t} in a few sentences."]).format(t=term)
    a = (f"{term[0].upper() + term[1:]} is {definition}. A simple example is {example}. "
         f"In short, {term} is {definition.split(',')[0]}.")
    return q, a, c


def compare(rng: random.Random) -> tuple[str, str]:
    a, b, fld, da, db = pick(rng, PAIRS)
    q = pick(rng, ["What is the difference between a {a} and a {b} in {f}?",
                   "In {f}, how does a {a} differ from a {b}?"]).format(a=a, b=b, f=fld)
    ans = (f"A {a} {da}, while a {b} {db}. Use a {a} when that behaviour is what you need, "
           f"and a {b} otherwise. In short, the main difference is that a {a} {da}.")
    return q, ans


def socratic(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(3)
    if k == 0:
        x1, y1 = rng.randint(-9, 9), rng.randint(-9, 9)
        dx, m = rng.randint(1, 6), rng.randint(-4, 4)
        x2, y2 = x1 + dx, y1 + m * dx
        return (f"How do you find the slope of the line through ({x1}, {y1}) and ({x2}, {y2})?",
                f"The slope is the change in y divided by the change in x.\n"
                f"m = ({y2} - {y1}) / ({x2} - {x1}) = {y2 - y1} / {dx} = {m}.\nThe slope is {m}.")
    if k == 1:
        p, n = pick(rng, [5, 10, 20, 25, 40, 50, 75]), rng.randint(2, 40) * 20
        return (f"What is {p}% of {n}?",
                f"To find {p}% of {n}, multiply {n} by {p}/100.\n{n} * {p} / 100 = {n * p // 100}.\n"
                f"So {p}% of {n} is {n * p // 100}.")
    c = rng.randint(-10, 40) * 5
    f = c * 9 // 5 + 32
    return (f"How do you convert {c} degrees Celsius to Fahrenheit?",
            f"Use the formula F = C * 9/5 + 32.\nF = {c} * 9/5 + 32 = {c * 9 // 5} + 32 = {f}.\n"
            f"So {c} degrees Celsius is {f} degrees Fahrenheit.")


def parity(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(2, 9)
    kind = pick(rng, ["even", "odd"])
    if kind == "even":
        return (f"Is the sum of {n} even numbers always even?",
                f"Yes. Every even number can be written as 2k. The sum of {n} such numbers is "
                f"2(k1 + ... + k{n}), which is 2 times an integer, so it is even.")
    res = "even" if n % 2 == 0 else "odd"
    return (f"Is the sum of {n} odd numbers even or odd?",
            f"Each odd number can be written as 2k + 1. The sum of {n} of them is 2(k1 + ... + k{n}) + {n}. "
            f"Since {n} is {res}, the sum is {res}.")


# ------------------------------------------------------------------ code (CodeFeedback, Infinity, traces)

@dataclass
class CodeTask:
    fn: list[str]
    desc: str
    how: str
    py: str
    js: str
    example: Callable[[random.Random], tuple[str, str]]


def _nums(rng: random.Random) -> list[int]:
    return [rng.randint(1, 20) for _ in range(rng.randint(3, 5))]


CODE = [
    CodeTask(["sum_list", "total", "add_all"], "returns the sum of a list of numbers",
             "adds each number to a running total and returns it",
             "def {fn}(numbers):\n    total = 0\n    for n in numbers:\n        total += n\n    return total",
             "function {fn}(numbers) {{\n  let total = 0;\n  for (const n of numbers) {{\n    total += n;\n  }}\n  return total;\n}}",
             lambda r: (lambda xs: (str(xs), str(sum(xs))))(_nums(r))),
    CodeTask(["find_max", "largest", "max_value"], "returns the largest number in a list",
             "keeps the largest value seen so far while it walks the list",
             "def {fn}(numbers):\n    best = numbers[0]\n    for n in numbers:\n        if n > best:\n            best = n\n    return best",
             "function {fn}(numbers) {{\n  let best = numbers[0];\n  for (const n of numbers) {{\n    if (n > best) {{\n      best = n;\n    }}\n  }}\n  return best;\n}}",
             lambda r: (lambda xs: (str(xs), str(max(xs))))(_nums(r))),
    CodeTask(["count_vowels", "vowel_count"], "counts the vowels in a string",
             "checks every character against the five vowels and counts the matches",
             "def {fn}(text):\n    count = 0\n    for ch in text.lower():\n        if ch in \"aeiou\":\n            count += 1\n    return count",
             "function {fn}(text) {{\n  let count = 0;\n  for (const ch of text.toLowerCase()) {{\n    if (\"aeiou\".includes(ch)) {{\n      count += 1;\n    }}\n  }}\n  return count;\n}}",
             lambda r: (lambda w: (json.dumps(w), str(sum(c in "aeiou" for c in w))))(pick(r, CITIES + ITEMS).lower())),
    CodeTask(["reverse_string", "reverse_text"], "reverses a string",
             "builds a new string from the characters in reverse order",
             "def {fn}(text):\n    return text[::-1]",
             "function {fn}(text) {{\n  return text.split(\"\").reverse().join(\"\");\n}}",
             lambda r: (lambda w: (json.dumps(w), json.dumps(w[::-1])))(pick(r, CITIES).lower())),
    CodeTask(["factorial", "fact"], "returns the factorial of a non-negative integer",
             "multiplies the numbers from 1 to n together",
             "def {fn}(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
             "function {fn}(n) {{\n  let result = 1;\n  for (let i = 2; i <= n; i++) {{\n    result *= i;\n  }}\n  return result;\n}}",
             lambda r: (lambda n: (str(n), str(__import__("math").factorial(n))))(r.randint(3, 8))),
    CodeTask(["is_prime", "check_prime"], "checks whether a number is prime",
             "tries every divisor up to the square root of n and stops at the first one that divides it",
             "def {fn}(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True",
             "function {fn}(n) {{\n  if (n < 2) {{\n    return false;\n  }}\n  for (let i = 2; i * i <= n; i++) {{\n    if (n % i === 0) {{\n      return false;\n    }}\n  }}\n  return true;\n}}",
             lambda r: (lambda n: (str(n), "True" if n > 1 and all(n % i for i in range(2, n)) else "False"))(r.randint(2, 50))),
    CodeTask(["filter_even", "even_numbers"], "returns only the even numbers from a list",
             "keeps each number whose remainder after division by 2 is zero",
             "def {fn}(numbers):\n    return [n for n in numbers if n % 2 == 0]",
             "function {fn}(numbers) {{\n  return numbers.filter((n) => n % 2 === 0);\n}}",
             lambda r: (lambda xs: (str(xs), str([x for x in xs if x % 2 == 0])))(_nums(r))),
]
LANGS = {"python": "Python", "javascript": "JavaScript"}
TABLES = [("customers", ["age", "balance"]), ("orders", ["total", "quantity"]), ("employees", ["salary", "age"]),
          ("products", ["price", "stock"])]


def code_task(rng: random.Random) -> tuple[str, str, str]:
    """(query, answer, lang)."""
    if rng.random() < 0.15:
        table, cols = pick(rng, TABLES)
        col, n = pick(rng, cols), rng.randint(1, 100) * 10
        q = pick(rng, ["Write a SQL query to find all {t} where {c} is greater than {n}.",
                       "How do I select the {t} with a {c} above {n} in SQL?"]).format(t=table, c=col, n=n)
        a = (f"You can use the following query:\n\n```sql\nSELECT *\nFROM {table}\nWHERE {col} > {n};\n```\n\n"
             f"This query returns every row of `{table}` whose `{col}` is greater than {n}.")
        return q, a, "sql"
    t = pick(rng, CODE)
    lang = pick(rng, ["python", "python", "javascript"])
    fn = pick(rng, t.fn)
    if lang == "javascript":
        fn = fn.split("_")[0] + "".join(p.title() for p in fn.split("_")[1:])
    arg, res = t.example(rng)
    if lang == "javascript":
        res = res.lower() if res in ("True", "False") else res
    q = pick(rng, ["Write a {L} function called `{fn}` that {d}.", "Implement `{fn}` in {L}: it {d}.",
                   "I need a {L} function that {d}. Please name it `{fn}`."]).format(L=LANGS[lang], fn=fn, d=t.desc)
    code = (t.py if lang == "python" else t.js).format(fn=fn)
    a = (f"Here is a {LANGS[lang]} function that {t.desc}:\n\n```{lang}\n{code}\n```\n\n"
         f"It {t.how}. For example, `{fn}({arg})` returns `{res}`.")
    return q, a, lang


# ------------------------------------------------------------------ tools (Hermes, agent, traces)

def _p(typ: str, desc: str, **kw) -> dict[str, Any]:
    return {"type": typ, "description": desc, **kw}


TOOLS = [  # name, description, properties, required
    ("get_weather", "Get the weather forecast for a city on a given date.",
     {"city": _p("string", "The name of the city."), "date": _p("string", "The date in YYYY-MM-DD format.")},
     ["city", "date"]),
    ("convert_currency", "Convert an amount of money from one currency to another using the latest rate.",
     {"amount": _p("number", "The amount to convert."), "from_currency": _p("string", "The three-letter code to convert from."),
      "to_currency": _p("string", "The three-letter code to convert to.")}, ["amount", "from_currency", "to_currency"]),
    ("get_stock_price", "Get the latest trading price of a stock.",
     {"symbol": _p("string", "The ticker symbol, for example AAPL.")}, ["symbol"]),
    ("search_restaurants", "Search for restaurants in a city that serve a given cuisine.",
     {"city": _p("string", "The city to search in."), "cuisine": _p("string", "The type of food, for example Italian.")},
     ["city", "cuisine"]),
    ("calculate_tip", "Calculate the tip for a restaurant bill.",
     {"bill_amount": _p("number", "The total bill."), "tip_percent": _p("number", "The tip as a percentage of the bill.")},
     ["bill_amount", "tip_percent"]),
    ("send_email", "Send an email to a recipient with a subject and a body.",
     {"to": _p("string", "The email address of the recipient."), "subject": _p("string", "The subject line."),
      "body": _p("string", "The text of the email.")}, ["to", "subject", "body"]),
    ("create_calendar_event", "Create an event in the user's calendar.",
     {"title": _p("string", "The title of the event."), "date": _p("string", "The date in YYYY-MM-DD format."),
      "time": _p("string", "The start time in HH:MM format.")}, ["title", "date", "time"]),
    ("get_news_headlines", "Get the latest news headlines for a topic.",
     {"topic": _p("string", "The news topic.", enum=TOPICS), "limit": _p("integer", "How many headlines to return.")},
     ["topic"]),
    ("search_flights", "Search for flights between two cities on a given date.",
     {"departure_city": _p("string", "The city the flight leaves from."),
      "destination_city": _p("string", "The city the flight goes to."),
      "date": _p("string", "The departure date in YYYY-MM-DD format."),
      "cabin": _p("string", "The cabin class.", enum=["economy", "business", "first"])},
     ["departure_city", "destination_city", "date"]),
    ("translate_text", "Translate a short text into another language.",
     {"text": _p("string", "The text to translate."), "target_language": _p("string", "The language to translate into.")},
     ["text", "target_language"]),
]
# Tools of the rows appended after the quirks (see "appended rows"): each with its own parameters and requests whose
# slots (places, dishes, films, tasks) vary many words, so the prompts survive near-dedup. Kept out of TOOLS, whose
# length the seeded draws of the first rows depend on.
LANDMARKS = ["the train station", "the old town", "the airport", "the city museum", "the harbour", "the university",
             "the central park", "the football stadium", "the main library", "the night market"]
MODES = {"driving": "by car", "walking": "on foot", "transit": "by public transport", "cycling": "by bike"}
DIETS = ["vegetarian", "vegan", "gluten-free", "low-carb"]
INGREDIENTS = ["chickpeas", "spinach", "mushrooms", "rice", "lentils", "tofu", "sweet potatoes", "eggplant", "broccoli",
               "zucchini", "quinoa", "tomatoes"]
DISHES = ["Curry", "Stir-Fry", "Salad", "Soup", "Bowl", "Stew"]
MOVIES = ["The Silent Harbor", "Northern Lights", "Paper Planets", "The Last Orchard", "Midnight Express Line",
          "Glass Mountains", "A Summer in Lisbon", "Robots of Tomorrow", "The Clockmaker's Daughter", "River of Stars"]
CINEMAS = ["Odeon", "Rex", "Lumiere", "Starlight", "Palace", "Grand"]
REMINDERS = ["call the dentist", "water the plants", "pay the electricity bill", "pick up the dry cleaning",
             "renew my passport", "book a table for dinner", "send the monthly report", "take the car for a service",
             "return the library books", "back up my laptop", "cancel the gym trial", "buy a birthday present for {name}",
             "call {name} back", "send {name} the photos"]
HOTEL_AREAS = ["near the airport", "in the old town", "close to the beach", "near the train station",
               "in the business district", "with a view of the river"]
EVENTS = {"concerts": "Concert", "theatre plays": "Play", "sports matches": "Cup Match", "food festivals": "Food Fair",
          "art exhibitions": "Art Show"}
GENRES = ["mystery", "science fiction", "history", "fantasy", "biography"]
BOOK_SUBJECTS = {"space travel": "the Stars", "ancient Rome": "the Forum", "the deep ocean": "the Deep",
                 "dragons": "the Dragon", "a small mountain village": "the Valley", "artificial intelligence": "the Machine",
                 "a famous chef": "the Kitchen", "a long sea voyage": "the Tide"}
AUDIENCES = ["a teenager", "a beginner", "a book club"]
SURNAMES = ["Moreau", "Tanaka", "Okafor", "Lindqvist", "Costa", "Haddad", "Novak", "Reyes"]

EXTRA_TOOLS = [
    ("get_directions", "Get a route between two places in a city.",
     {"origin": _p("string", "Where the route starts."), "destination": _p("string", "Where the route ends."),
      "city": _p("string", "The city both places are in."), "mode": _p("string", "How to travel.", enum=list(MODES))},
     ["origin", "destination", "city", "mode"]),
    ("search_recipes", "Search for recipes that use an ingredient and fit a diet.",
     {"ingredient": _p("string", "The main ingredient."), "diet": _p("string", "The diet the recipe must fit.", enum=DIETS),
      "max_minutes": _p("integer", "The longest cooking time in minutes.")}, ["ingredient", "diet"]),
    ("get_movie_showtimes", "Get the showtimes of a film in a city on a given date.",
     {"movie": _p("string", "The title of the film."), "city": _p("string", "The city to search in."),
      "date": _p("string", "The date in YYYY-MM-DD format.")}, ["movie", "city", "date"]),
    ("set_reminder", "Set a reminder that alerts the user at a date and time.",
     {"text": _p("string", "What to remind the user of."), "date": _p("string", "The date in YYYY-MM-DD format."),
      "time": _p("string", "The time in HH:MM format.")}, ["text", "date", "time"]),
    ("book_hotel", "Book a hotel room in a city.",
     {"city": _p("string", "The city to stay in."), "area": _p("string", "The part of the city to stay in."),
      "check_in": _p("string", "The check-in date in YYYY-MM-DD format."), "nights": _p("integer", "How many nights to stay."),
      "guests": _p("integer", "How many people stay in the room.")}, ["city", "check_in", "nights", "guests"]),
    ("find_events", "Find public events of a kind in a city on a given date.",
     {"city": _p("string", "The city to search in."), "category": _p("string", "The kind of event.", enum=list(EVENTS)),
      "date": _p("string", "The date in YYYY-MM-DD format.")}, ["city", "category", "date"]),
    ("recommend_books", "Recommend books of a genre about a subject for a reader.",
     {"genre": _p("string", "The genre of the book.", enum=GENRES), "subject": _p("string", "What the book is about."),
      "audience": _p("string", "Who will read the book.")}, ["genre", "subject"]),
]
EXTRA_NAMES = [t[0] for t in EXTRA_TOOLS]
TOOL_INDEX = {t[0]: t for t in TOOLS + EXTRA_TOOLS}


def openai_tool(name: str) -> dict[str, Any]:
    _, desc, props, req = TOOL_INDEX[name]
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": props, "required": req}}}


def glaive_tool(name: str) -> dict[str, Any]:
    return openai_tool(name)["function"]


def llamafactory_tool(name: str) -> dict[str, Any]:
    # As published: "dict"/"str"-style types and `required` beside, not inside, `parameters`.
    _, desc, props, req = TOOL_INDEX[name]
    kinds = {"string": "str", "number": "float", "integer": "int"}
    ps = {k: {"description": v["description"], "type": kinds[v["type"]]} for k, v in props.items()}
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "dict", "properties": ps}, "required": req}}


def tool_task(rng: random.Random, names: list[str]) -> dict[str, Any]:
    """A request one of ``names`` answers: the user text, the call, the tool result and the final answer."""
    name = pick(rng, names)
    city, date = pick(rng, CITIES), pick(rng, DATES)
    if name == "get_weather":
        cond, hi = pick(rng, CONDITIONS), rng.randint(-5, 35)
        lo = hi - rng.randint(3, 10)
        return dict(user=pick(rng, ["What will the weather be in {c} on {d}?", "Can you check the forecast for {c} on {d}?",
                                    "I am visiting {c} on {d}. How is the weather going to be?"]).format(c=city, d=date),
                    args={"city": city, "date": date},
                    result={"city": city, "date": date, "condition": cond, "high_c": hi, "low_c": lo},
                    answer=f"The weather in {city} on {date} will be {cond}, with a high of {hi}°C and a low of {lo}°C.")
    if name == "convert_currency":
        amt, f, t = rng.randint(1, 100) * 10, pick(rng, CURRENCIES), pick(rng, CURRENCIES)
        rate = rng.randint(50, 200) / 100
        res = round(amt * rate, 2)
        return dict(user=pick(rng, ["How much is {a} {f} in {t}?", "Please convert {a} {f} to {t}."]).format(a=amt, f=f, t=t),
                    args={"amount": amt, "from_currency": f, "to_currency": t},
                    result={"converted_amount": res, "rate": rate},
                    answer=f"{amt} {f} is about {res} {t}, at a rate of {rate}.")
    if name == "get_stock_price":
        s, p = pick(rng, SYMBOLS), rng.randint(2000, 60000) / 100
        return dict(user=pick(rng, ["What is the current price of {s}?", "How much is {s} stock trading at right now?"]).format(s=s),
                    args={"symbol": s}, result={"symbol": s, "price": p},
                    answer=f"The current price of {s} is ${p}.")
    if name == "search_restaurants":
        cu = pick(rng, CUISINES)
        r1, r2 = f"The {pick(rng, PLACE_WORDS)}", f"{pick(rng, NAMES)}'s {pick(rng, PLACE_WORDS)}"
        return dict(user=pick(rng, ["Find me a {u} restaurant in {c}.", "Are there any good {u} places to eat in {c}?"]).format(u=cu, c=city),
                    args={"city": city, "cuisine": cu}, result={"restaurants": [r1, r2]},
                    answer=f"I found two {cu} restaurants in {city}: {r1} and {r2}.")
    if name == "calculate_tip":
        bill, pct = rng.randint(20, 200), pick(rng, [10, 15, 18, 20])
        tip = round(bill * pct / 100, 2)
        return dict(user=f"My bill is ${bill}. How much should I tip at {pct} percent?",
                    args={"bill_amount": bill, "tip_percent": pct}, result={"tip_amount": tip},
                    answer=f"A {pct}% tip on a ${bill} bill is ${tip}.")
    if name == "send_email":
        who = pick(rng, NAMES)
        to, subj = f"{who.lower()}@example.com", pick(rng, ["Meeting notes", "Lunch on Friday", "Project update", "Thank you"])
        return dict(user=f"Send an email to {to} with the subject \"{subj}\" saying that I will call tomorrow.",
                    args={"to": to, "subject": subj, "body": "I will call you tomorrow."}, result={"status": "sent"},
                    answer=f"Your email to {to} with the subject \"{subj}\" has been sent.")
    if name == "create_calendar_event":
        title, time = pick(rng, ["Dentist", "Team meeting", "Yoga class", "Dinner with friends"]), f"{rng.randint(8, 20):02d}:00"
        return dict(user=f"Add \"{title}\" to my calendar on {date} at {time}.",
                    args={"title": title, "date": date, "time": time}, result={"status": "created", "event_id": rng.randint(100, 999)},
                    answer=f"I added \"{title}\" to your calendar on {date} at {time}.")
    if name == "get_news_headlines":
        topic = pick(rng, TOPICS)
        heads = [f"{pick(rng, CITIES)} hosts a {topic} summit", f"New {topic} report published"]
        return dict(user=pick(rng, ["What are the latest {t} headlines?", "Give me the news about {t}."]).format(t=topic),
                    args={"topic": topic, "limit": 2}, result={"headlines": heads},
                    answer=f"Here are the latest {topic} headlines: \"{heads[0]}\" and \"{heads[1]}\".")
    if name == "search_flights":
        dst, cabin = pick(rng, CITIES), pick(rng, ["economy", "business"])
        fl, price = f"{pick(rng, ['AA', 'BA', 'LH', 'AF', 'JL'])}{rng.randint(100, 999)}", rng.randint(150, 1500)
        return dict(user=f"Find a {cabin} flight from {city} to {dst} on {date}.",
                    args={"departure_city": city, "destination_city": dst, "date": date, "cabin": cabin},
                    result={"flights": [{"flight_number": fl, "price_usd": price}]},
                    answer=f"I found flight {fl} from {city} to {dst} on {date} in {cabin} for ${price}.")
    text, lang = pick(rng, ["Good morning", "Thank you very much", "Where is the station?"]), pick(rng, ["French", "Spanish", "German"])
    out = {"French": "[fr] ", "Spanish": "[es] ", "German": "[de] "}[lang] + text
    return dict(user=f"Translate \"{text}\" into {lang}.", args={"text": text, "target_language": lang},
                result={"translation": out}, answer=f"In {lang}, \"{text}\" is \"{out}\".")


def extra_tool_task(rng: random.Random, names: list[str]) -> dict[str, Any]:
    """As :func:`tool_task`, for the EXTRA_TOOLS of the appended rows; the dict names its tool too."""
    name = pick(rng, names)
    city, date = pick(rng, CITIES), pick(rng, DATES)
    if name == "get_directions":
        origin, dest = rng.sample(LANDMARKS, 2)
        mode = pick(rng, list(MODES))
        km = rng.randint(2, 40) / 2
        minutes = max(5, int(km * {"driving": 3, "walking": 12, "transit": 5, "cycling": 4}[mode]))
        user = pick(rng, ["How do I get from {o} to {d} in {c} {m}?", "What is the best route from {o} to {d} in {c} {m}?",
                          "I am in {c}. Show me the way from {o} to {d} {m}, please."])
        return dict(name=name, user=user.format(o=origin, d=dest, c=city, m=MODES[mode]),
                    args={"origin": origin, "destination": dest, "city": city, "mode": mode},
                    result={"distance_km": km, "duration_min": minutes},
                    answer=f"The route from {origin} to {dest} in {city} {MODES[mode]} is {km} km long and takes about "
                           f"{minutes} minutes.")
    if name == "search_recipes":
        ing, diet, most = pick(rng, INGREDIENTS), pick(rng, DIETS), pick(rng, [15, 20, 30, 45, 60])
        dish, minutes = f"{ing.title()} {pick(rng, DISHES)}", most - 5 * rng.randint(0, 2)
        user = pick(rng, ["Find me a {d} recipe with {i} that takes less than {m} minutes.",
                          "I have some {i}. What {d} dish can I cook in under {m} minutes?",
                          "Suggest a quick {d} meal made with {i}, ready within {m} minutes."])
        return dict(name=name, user=user.format(d=diet, i=ing, m=most),
                    args={"ingredient": ing, "diet": diet, "max_minutes": most},
                    result={"recipes": [{"name": dish, "minutes": minutes}]},
                    answer=f"Try {dish}: a {diet} dish with {ing} that is ready in {minutes} minutes.")
    if name == "get_movie_showtimes":
        movie, cinema = pick(rng, MOVIES), f"{pick(rng, CINEMAS)} Cinema"
        times = [f"{rng.randint(14, 17)}:30", f"{rng.randint(19, 22)}:00"]
        user = pick(rng, ["When is {f} playing in {c} on {d}?", "Find the showtimes for {f} in {c} on {d}.",
                          "Is {f} showing at any cinema in {c} on {d}?"])
        return dict(name=name, user=user.format(f=movie, c=city, d=date), args={"movie": movie, "city": city, "date": date},
                    result={"cinema": cinema, "times": times},
                    answer=f"{movie} is playing at the {cinema} in {city} on {date} at {times[0]} and {times[1]}.")
    if name == "set_reminder":
        task, time = pick(rng, REMINDERS).format(name=pick(rng, NAMES)), f"{rng.randint(7, 21):02d}:{pick(rng, ['00', '15', '30', '45'])}"
        user = pick(rng, ["Remind me to {t} on {d} at {h}.", "Can you set a reminder on {d} at {h} to {t}?",
                          "Please make sure I do not forget to {t}: remind me at {h} on {d}."])
        return dict(name=name, user=user.format(t=task, d=date, h=time), args={"text": task, "date": date, "time": time},
                    result={"status": "scheduled", "reminder_id": rng.randint(1000, 9999)},
                    answer=f"Done. I will remind you on {date} at {time} to {task.replace('my ', 'your ')}.")
    if name == "book_hotel":
        area, nights, guests = pick(rng, HOTEL_AREAS), rng.randint(1, 7), rng.randint(1, 4)
        hotel, price = f"Hotel {pick(rng, PLACE_WORDS)}", rng.randint(60, 400)
        user = pick(rng, ["Book a hotel {a} in {c} for {g} guests, {n} nights from {d}.",
                          "I need a room for {g} people {a} in {c}, checking in on {d} for {n} nights."])
        return dict(name=name, user=user.format(a=area, c=city, g=guests, n=nights, d=date),
                    args={"city": city, "area": area, "check_in": date, "nights": nights, "guests": guests},
                    result={"hotel": hotel, "price_per_night_usd": price, "status": "booked"},
                    answer=f"I booked {hotel} {area} in {city} for {guests} guests, {nights} nights from {date}, "
                           f"at ${price} per night.")
    if name == "find_events":
        kind = pick(rng, list(EVENTS))
        event = f"the {pick(rng, ['Spring', 'Summer', 'City', 'Open-Air', 'Riverside'])} {EVENTS[kind]}"
        hour = rng.randint(10, 21)
        user = pick(rng, ["What {k} are on in {c} on {d}?", "Are there any {k} in {c} on {d}?",
                          "Find {k} happening in {c} on {d}."])
        return dict(name=name, user=user.format(k=kind, c=city, d=date), args={"city": city, "category": kind, "date": date},
                    result={"events": [{"name": event, "start": f"{hour}:00"}]},
                    answer=f"On {date} in {city} you can go to {event}, which starts at {hour}:00.")
    genre, (subject, place), reader = pick(rng, GENRES), pick(rng, list(BOOK_SUBJECTS.items())), pick(rng, AUDIENCES)
    title = f"{pick(rng, ['Secrets of', 'Letters from', 'A Journey to', 'Beyond'])} {place}"
    author = f"{pick(rng, NAMES)} {pick(rng, SURNAMES)}"
    user = pick(rng, ["Recommend a {g} book about {s} for {r}.", "Can you suggest a good {g} book on {s}? It is for {r}.",
                      "What {g} book about {s} would you give to {r}?"])
    return dict(name=name, user=user.format(g=genre, s=subject, r=reader),
                args={"genre": genre, "subject": subject, "audience": reader},
                result={"books": [{"title": title, "author": author}]},
                answer=f"I recommend \"{title}\" by {author}, a {genre} book about {subject} that suits {reader}.")


def hermes_system(names: list[str], tools_text: str | None = None) -> str:
    tools = tools_text if tools_text is not None else repr([openai_tool(n) for n in names])
    return ("You are a function calling AI model. You are provided with function signatures within <tools> </tools> "
            "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions about "
            f"what values to plug into functions.\n<tools>\n{tools}\n</tools>\nFor each function call return a json "
            "object with function name and arguments within <tool_call> </tool_call> tags with the following schema:\n"
            "<tool_call>\n{'arguments': <args-dict>, 'name': <function-name>}\n</tool_call>\n")


ALL_TOOLS = [t[0] for t in TOOLS]
# The long (~3 KB) tool list that many requests share, as agent frameworks send it in front of every request.
SHARED_TOOLS = ALL_TOOLS[:7]


# ------------------------------------------------------------------ quirk bookkeeping

@dataclass
class Row:
    value: Any  # a JSON-able object, or the raw text of a broken line (str)
    quirk: str | None = None
    of: "Row | None" = None
    raw: bool = False


@dataclass
class Sample:
    rows: list[Row] = field(default_factory=list)

    def add(self, value: Any) -> Row:
        row = Row(value)
        self.rows.append(row)
        return row

    def insert(self, rng: random.Random, row: Row) -> Row:
        self.rows.insert(rng.randrange(len(self.rows) + 1), row)
        return row

    def duplicate(self, rng: random.Random, n: int, mutate: Callable[[Any], Any] | None = None, quirk="exact_duplicate"):
        for _ in range(n):
            src = pick(rng, [r for r in self.rows if r.quirk is None and not r.raw])
            value = json.loads(json.dumps(src.value))
            self.insert(rng, Row(mutate(value) if mutate else value, quirk, src))

    def write(self, out: Path, name: str) -> tuple[int, dict[str, list]]:
        lines, quirks = [], {}
        where = {id(r): i for i, r in enumerate(self.rows, 1)}
        for i, r in enumerate(self.rows, 1):
            lines.append(r.value if r.raw else json.dumps(r.value, ensure_ascii=False))
            if r.quirk:
                quirks.setdefault(r.quirk, []).append([i, where[id(r.of)]] if r.of else i)
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return len(lines), quirks


def whitespace_variant(get: Callable[[Any], dict], key: str):
    """Same text with trailing spaces and a doubled space: equal after whitespace normalisation only."""
    def mutate(v):
        t = get(v)
        t[key] = t[key].replace(" ", "  ", 1) + "  \n"
        return v
    return mutate


# ------------------------------------------------------------------ the seven sources

def make_infinity(rng: random.Random) -> Sample:
    s = Sample()
    n = 0

    def row(convs, kind, lang="en", source="Subjective"):
        nonlocal n
        n += 1
        ab, ab_zh, cat, cat_zh = LABELS[kind]
        return {"id": n, "conversations": convs,
                "label": {"ability_en": [ab], "ability_zh": [ab_zh], "cate_ability_en": [cat], "cate_ability_zh": [cat_zh]},
                "langdetect": lang, "source": source, "reward": rng.randint(-80, 100) / 4}

    def h(v): return {"from": "human", "value": v}
    def g(v): return {"from": "gpt", "value": v}

    for _ in range(560):
        k = rng.random()
        if k < 0.3:
            q, a, (term, definition, example) = explain(rng)
            convs = [h(q), g(a)]
            if rng.random() < 0.35:
                convs += [h(pick(rng, ["Can you give another example?", "Give me an example."])),
                          g(f"Sure. Another example of {term} is {example}. It shows {definition.split(',')[0]}.")]
            if rng.random() < 0.2:
                convs.insert(0, {"from": "system", "value": pick(rng, SYSTEM_PROMPTS)})
            s.add(row(convs, "explain"))
        elif k < 0.5:
            goal = pick(rng, list(GOALS))
            tips = rng.sample(GOALS[goal], 3)
            q = pick(rng, ["Give me three tips for {g}.", "What are three good tips for {g}?"]).format(g=goal)
            a = f"Here are three tips for {goal}:\n1. {tips[0]}\n2. {tips[1]}\n3. {tips[2]}"
            convs = [h(q), g(a)]
            if rng.random() < 0.3:
                convs += [h("Which one is the most important?"), g(f"If you only pick one, start with this: {tips[0]}")]
            s.add(row(convs, "tips"))
        elif k < 0.7:
            t = rng.randrange(len(GSM))
            sl = gsm_slots(rng, t)
            s.add(row([h(GSM[t].question.format(**sl)), g(gsm_response(t, sl))], "math", source="MetaMath"))
        elif k < 0.9:
            q, a, _ = code_task(rng)
            s.add(row([h(q), g(a)], "code", source="code_exercises"))
        else:
            q, a = compare(rng)
            s.add(row([{"from": "system", "value": SYSTEM_PROMPTS[0]}, h(q), g(a)], "explain", source="OpenHermes-2.5"))
    for _ in range(24):  # a few Chinese rows, as in Infinity-Instruct
        term, definition = pick(rng, CONCEPTS_ZH)
        q = pick(rng, ["请用一句话解释{t}。", "什么是{t}？"]).format(t=term)
        s.add(row([h(q), g(f"{term}是{definition}。简单地说，{term}就是{definition}。")], "explain", lang="zh-cn"))
    first_human = lambda v: next(m for m in v["conversations"] if m["from"] == "human")
    s.duplicate(rng, 10)
    s.duplicate(rng, 6, whitespace_variant(first_human, "value"), "whitespace_duplicate")

    def near(v):  # one word of the question changed
        m = first_human(v)
        m["value"] = m["value"].replace(" me ", " us ", 1) if " me " in m["value"] else "Please: " + m["value"]
        return v
    s.duplicate(rng, 6, near, "near_duplicate")
    for quirk, value in [("empty_answer", row([h("Explain gravity in simple terms."), g("")], "explain")),
                         ("no_answer", row([h("Give me three tips for saving money.")], "tips")),
                         ("empty_conversations", row([], "explain")),
                         ("empty_question", row([h(""), g("I am not sure what you are asking.")], "explain"))]:
        s.insert(rng, Row(value, quirk))
    return s


def make_webinstruct(rng: random.Random) -> Sample:
    s = Sample()
    for _ in range(480):
        k = rng.random()
        if k < 0.4:
            q, a = socratic(rng)
            src = "socratic"
        elif k < 0.7:
            q, a = compare(rng) if rng.random() < 0.6 else explain(rng)[:2]
            src = "stackexchange"
        else:
            q, a = parity(rng) if rng.random() < 0.4 else math_problem(rng)[::2]
            src = "mathstackexchange"
        s.add({"question": q, "answer": a, "source": src})
    s.duplicate(rng, 8)
    s.duplicate(rng, 5, whitespace_variant(lambda v: v, "question"), "whitespace_duplicate")
    s.insert(rng, Row({"question": "What is 20% of 300?", "answer": "", "source": "socratic"}, "empty_answer"))
    s.insert(rng, Row({"question": "", "answer": "The slope is 2.", "source": "socratic"}, "empty_question"))
    s.insert(rng, Row('{"question": "What is 50% of 80?", "answer": "To find 50% of 80, multiply', "broken_json", raw=True))
    return s


def make_codefeedback(rng: random.Random) -> Sample:
    s = Sample()
    for _ in range(400):
        q, a, lang = code_task(rng)
        s.add({"query": q, "answer": a, "resource": pick(rng, ["evolinstruct", "magicoder", "codealpaca", "wizardcoder"]),
               "lang": lang})
    s.duplicate(rng, 8)
    s.duplicate(rng, 4, whitespace_variant(lambda v: v, "query"), "whitespace_duplicate")

    def near(v):
        q = v["query"]
        v["query"] = "We need" + q[len("I need"):] if q.startswith("I need") else "Please " + q[0].lower() + q[1:]
        return v
    s.duplicate(rng, 5, near, "near_duplicate")
    s.insert(rng, Row({"query": "Write a Python function that reverses a string.", "answer": "", "resource": "evolinstruct",
                       "lang": "python"}, "empty_answer"))
    s.insert(rng, Row('{"query": "Write a SQL query to find all orders where total is greater than 50.", "answer": ',
                      "broken_json", raw=True))
    return s


def make_metamath(rng: random.Random) -> Sample:
    s = Sample()
    for _ in range(190):  # each GSM problem appears in up to four MetaMathQA types
        t = rng.randrange(len(GSM))
        sl = gsm_slots(rng, t)
        orig = GSM[t].question.format(**sl)
        s.add({"type": "GSM_AnsAug", "query": orig, "original_question": orig, "response": gsm_response(t, sl)})
        if rng.random() < 0.6:
            s.add({"type": "GSM_Rephrased", "query": GSM[t].rephrased.format(**sl), "original_question": orig,
                   "response": gsm_response(t, sl)})
        for kind, fobar in (("GSM_SV", False), ("GSM_FOBAR", True)):
            if rng.random() < 0.5:
                q, r = gsm_unknown(t, sl, fobar)
                s.add({"type": kind, "query": q, "original_question": orig, "response": r})
    for _ in range(150):
        q, rq, r = math_problem(rng)
        s.add({"type": "MATH_AnsAug", "query": q, "original_question": q, "response": r})
        if rng.random() < 0.4:
            s.add({"type": "MATH_Rephrased", "query": rq, "original_question": q, "response": r})
    # Variants that differ only in their numbers: same template, name and item, new numbers.
    for _ in range(12):
        t = rng.randrange(len(GSM))
        sl = gsm_slots(rng, t)
        sl2 = {**sl, **{k: v for k, v in gsm_slots(rng, t).items() if k in ("a", "b", "ans")}}
        if (sl2["a"], sl2["b"]) == (sl["a"], sl["b"]):
            sl2["a"] += 1
            sl2["ans"] = GSM[t].ans(sl2["a"], sl2["b"])
        fobar = rng.random() < 0.5
        kind = "GSM_FOBAR" if fobar else "GSM_SV"
        first = None
        for slots in (sl, sl2):
            q, r = gsm_unknown(t, slots, fobar)
            value = {"type": kind, "query": q, "original_question": GSM[t].question.format(**slots), "response": r}
            if first is None:
                first = s.insert(rng, Row(value))
            else:
                s.insert(rng, Row(value, "numbers_only_variant", first))
    s.duplicate(rng, 10)
    s.duplicate(rng, 5, whitespace_variant(lambda v: v, "query"), "whitespace_duplicate")
    s.insert(rng, Row({"type": "GSM_AnsAug", "query": "", "original_question": "", "response": "The answer is: 0"},
                      "empty_question"))
    return s


def make_hermes(rng: random.Random) -> Sample:
    s = Sample()
    shared = hermes_system(SHARED_TOOLS)
    categories = {"get_weather": ("Travel", "Weather", "Weather Lookup"), "search_flights": ("Travel", "Flights", "Flight Search"),
                  "convert_currency": ("Finance", "Currency", "Currency Conversion"), "get_stock_price": ("Finance", "Stocks", "Stock Quote"),
                  "search_restaurants": ("Food", "Restaurants", "Restaurant Search"), "calculate_tip": ("Food", "Payments", "Tip Calculation"),
                  "send_email": ("Productivity", "Email", "Send Email"), "create_calendar_event": ("Productivity", "Calendar", "Schedule Event"),
                  "get_news_headlines": ("Media", "News", "Headlines"), "translate_text": ("Language", "Translation", "Translate Text")}

    def call_text(task):
        return "<tool_call>\n" + repr({"arguments": task["args"], "name": task["name"]}) + "\n</tool_call>\n"

    for _ in range(340):
        if rng.random() < 0.65:  # the long shared system prompt in front of many distinct requests
            names, system = SHARED_TOOLS, shared
        else:
            names = rng.sample(ALL_TOOLS, rng.randint(1, 2))
            system = hermes_system(names)
        task = tool_task(rng, names)
        task["name"] = next(n for n in names if set(task["args"]) <= set(TOOL_INDEX[n][2]))
        convs = [{"from": "system", "value": system}, {"from": "human", "value": task["user"]},
                 {"from": "gpt", "value": call_text(task)},
                 {"from": "tool", "value": "<tool_response>\n" + json.dumps({"name": task["name"], "content": task["result"]})
                  + "\n</tool_response>\n"},
                 {"from": "gpt", "value": task["answer"]}]
        if rng.random() < 0.15 and len(names) > 1:  # a second request in the same conversation
            t2 = tool_task(rng, names)
            t2["name"] = next(n for n in names if set(t2["args"]) <= set(TOOL_INDEX[n][2]))
            convs += [{"from": "human", "value": "Thanks. " + t2["user"]}, {"from": "gpt", "value": call_text(t2)},
                      {"from": "tool", "value": "<tool_response>\n" + json.dumps({"name": t2["name"], "content": t2["result"]})
                       + "\n</tool_response>\n"}, {"from": "gpt", "value": t2["answer"]}]
        cat, sub, tk = categories[task["name"]]
        s.add({"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "conversations": convs,
               "category": cat, "subcategory": sub, "task": tk})
    s.duplicate(rng, 8)
    s.duplicate(rng, 4, whitespace_variant(lambda v: v["conversations"][1], "value"), "whitespace_duplicate")

    def broken(system: str, quirk: str, gpt: str | None = None):
        task = tool_task(rng, ["get_weather"])
        task["name"] = "get_weather"
        convs = [{"from": "system", "value": system}, {"from": "human", "value": task["user"]},
                 {"from": "gpt", "value": gpt if gpt is not None else call_text(task)}]
        s.insert(rng, Row({"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "conversations": convs,
                           "category": "Travel", "subcategory": "Weather", "task": "Weather Lookup"}, quirk))
    bad = repr([openai_tool("get_weather")])[:-30]  # cut mid-way: no longer a Python literal
    broken(hermes_system([], bad), "bad_tools_repr")
    broken(hermes_system([], "[{'type': 'function', 'function': {'name': 'get_weather', 'parameters': }}]"), "bad_tools_repr")
    broken(shared.replace("<tools>", "").replace("</tools>", ""), "no_tools_tag")
    broken(shared, "bad_tool_call", "<tool_call>\n{'arguments': {'city': 'Paris', 'date': }, 'name': 'get_weather'}\n</tool_call>\n")
    broken(shared, "empty_answer", "")
    return s


def make_agent(rng: random.Random) -> Sample:
    s = Sample()
    shared_names = SHARED_TOOLS
    shared_glaive = json.dumps([glaive_tool(n) for n in shared_names], ensure_ascii=False)
    shared_lf = json.dumps([llamafactory_tool(n) for n in shared_names], ensure_ascii=False)
    reason_sys = ("You are a methodical and expert assistant. Your primary goal is to solve user requests by leveraging "
                  "a set of available tools. You must reason for the best course of action in a structured manner before responding.")

    for _ in range(210):  # sharegpt rows: human / gpt / function_call / observation, tools as a JSON string
        shared = rng.random() < 0.6
        names = shared_names if shared else rng.sample(ALL_TOOLS, rng.randint(1, 3))
        tools = shared_glaive if shared else json.dumps([glaive_tool(n) for n in names], ensure_ascii=False)
        convs = []
        for turn in range(1 if rng.random() < 0.7 else 2):
            task = tool_task(rng, names)
            name = next(n for n in names if set(task["args"]) <= set(TOOL_INDEX[n][2]))
            convs += [{"from": "human", "value": task["user"]},
                      {"from": "function_call", "value": json.dumps({"name": name, "arguments": task["args"]}, ensure_ascii=False)},
                      {"from": "observation", "value": json.dumps(task["result"], ensure_ascii=False)},
                      {"from": "gpt", "value": task["answer"]}]
        if rng.random() < 0.15:  # a request no tool serves
            convs += [{"from": "human", "value": pick(rng, ["Can you also order a taxi for me?", "Could you book a hotel room too?"])},
                      {"from": "gpt", "value": "I'm sorry, but I can't do that because I don't have a tool for it. "
                                               "I can only help with the functions I have been given."}]
        s.add({"conversations": convs, "tools": tools})
    for _ in range(190):  # typed content parts: text / reasoning / tool_call
        shared = rng.random() < 0.6
        names = shared_names if shared else rng.sample(ALL_TOOLS, rng.randint(1, 3))
        tools = shared_lf if shared else json.dumps([llamafactory_tool(n) for n in names], ensure_ascii=False)
        task = tool_task(rng, names)
        name = next(n for n in names if set(task["args"]) <= set(TOOL_INDEX[n][2]))
        msgs = [{"role": "system", "content": [{"type": "text", "value": reason_sys}]},
                {"role": "user", "content": [{"type": "text", "value": task["user"]}]},
                {"role": "assistant", "content": [
                    {"type": "reasoning", "value": f"The user wants help with this request. The {name} tool can answer it, "
                                                   f"so I will call it with {json.dumps(task['args'], ensure_ascii=False)}."},
                    {"type": "tool_call", "value": json.dumps({"name": name, "arguments": task["args"]}, ensure_ascii=False)}]},
                {"role": "tool", "content": [{"type": "text", "value": json.dumps([{"name": name, "content": task["result"]}],
                                                                                 ensure_ascii=False)}]},
                {"role": "assistant", "content": [
                    {"type": "reasoning", "value": f"The {name} tool returned the result. I can now answer the user directly."},
                    {"type": "text", "value": task["answer"]}]}]
        s.add({"messages": msgs, "tools": tools})
    s.duplicate(rng, 8)
    s.duplicate(rng, 4, whitespace_variant(lambda v: (v.get("conversations") or v["messages"][1]["content"])[0], "value"),
                "whitespace_duplicate")
    task = tool_task(rng, ["get_weather"])
    call = json.dumps({"name": "get_weather", "arguments": task["args"]})
    for quirk, value in [
        ("bad_tools_json", {"conversations": [{"from": "human", "value": task["user"]}, {"from": "function_call", "value": call},
                                              {"from": "observation", "value": json.dumps(task["result"])},
                                              {"from": "gpt", "value": task["answer"]}], "tools": shared_glaive[:-40]}),
        ("bad_function_call", {"conversations": [{"from": "human", "value": task["user"]},
                                                 {"from": "function_call", "value": call[:-12]},
                                                 {"from": "observation", "value": "{}"}, {"from": "gpt", "value": task["answer"]}],
                               "tools": shared_glaive}),
        ("empty_conversations", {"conversations": [], "tools": "[]"}),
        ("empty_answer", {"messages": [{"role": "user", "content": [{"type": "text", "value": task["user"]}]},
                                       {"role": "assistant", "content": [{"type": "text", "value": ""}]}], "tools": shared_lf}),
    ]:
        s.insert(rng, Row(value, quirk))
    return s


def make_traces(rng: random.Random) -> Sample:
    s = Sample()
    n = 0
    travel_sys = ("You are a travel and finance assistant for the Draftline demo app. Answer briefly and call a tool "
                  "whenever one can answer the request. Never invent prices, flights or forecasts.")
    shared_tools = [openai_tool(t) for t in SHARED_TOOLS]

    def trace(body) -> dict:
        nonlocal n
        n += 1
        return {"id": f"req-{n:05d}", "endpoint": pick(rng, ["POST http://localhost:30000/v1/chat/completions",
                                                             "POST https://api.example.com/v1/chat/completions"]),
                "body": body}

    def question(r):
        k = r.random()
        if k < 0.3:
            return socratic(r)[0]
        if k < 0.55:
            return explain(r)[0]
        if k < 0.8:
            t = r.randrange(len(GSM))
            return GSM[t].question.format(**gsm_slots(r, t))
        return code_task(r)[0]

    for _ in range(300):
        k = rng.random()
        opts = {}
        if rng.random() < 0.6:
            opts["max_tokens"] = pick(rng, [128, 256, 512, 1024])
        if rng.random() < 0.4:
            opts["temperature"] = pick(rng, [0.0, 0.2, 0.7, 1.0])
        model = pick(rng, ["qwen3-8b", "Qwen/Qwen3-32B", "gpt-4o-mini"])
        if k < 0.3:
            body = {"model": model, "messages": [{"role": "user", "content": question(rng)}], **opts}
        elif k < 0.45:
            body = {"model": model, "messages": [{"role": "system", "content": pick(rng, SYSTEM_PROMPTS)},
                                                 {"role": "user", "content": question(rng)}], **opts}
        elif k < 0.55:
            body = {"model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": question(rng)}]}], **opts}
        elif k < 0.63:
            url = TINY_PNG if rng.random() < 0.4 else f"https://images.example.com/photo-{rng.randint(1, 999)}.jpg"
            part = {"type": "image_url", "image_url": {"url": url, **({"detail": "high"} if rng.random() < 0.3 else {})}}
            body = {"model": model, "messages": [{"role": "user", "content": [
                {"type": "text", "text": pick(rng, ["Describe this image in one sentence.", "What is in this picture?"])}, part]}], **opts}
        elif k < 0.7:
            q1, a1, (term, _, _) = explain(rng)
            body = {"model": model, "messages": [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                                                 {"role": "user", "content": "Give me another example."}], **opts}
        else:  # the shared system prompt and tools in front of many distinct requests
            task = tool_task(rng, SHARED_TOOLS)
            body = {"model": model, "messages": [{"role": "system", "content": travel_sys},
                                                 {"role": "user", "content": task["user"]}],
                    "tools": shared_tools, "tool_choice": "auto", **opts}
        if rng.random() < 0.1:
            body["stream"] = True
        s.add(trace(body))
    s.duplicate(rng, 8)
    ws_candidates = [r for r in s.rows if isinstance(r.value["body"]["messages"][-1]["content"], str) and r.quirk is None]
    for _ in range(4):
        src = pick(rng, ws_candidates)
        v = json.loads(json.dumps(src.value))
        v["body"]["messages"][-1]["content"] = v["body"]["messages"][-1]["content"].replace(" ", "  ", 1) + "  \n"
        s.insert(rng, Row(v, "whitespace_duplicate", src))
    img = {"type": "image_url", "image_url": {"url": TINY_PNG}}
    for quirk, value in [
        ("image_only", trace({"model": "qwen3-vl", "messages": [{"role": "user", "content": [img]}]})),
        ("image_only", trace({"model": "qwen3-vl", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://images.example.com/cat.jpg"}}]}]})),
        ("empty_content", trace({"model": "qwen3-8b", "messages": [{"role": "user", "content": ""}]})),
        ("empty_messages", trace({"model": "qwen3-8b", "messages": []})),
        ("responses_api", trace({"model": "gpt-4.1", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is 25% of 640?"}]}]})),
        ("responses_api", trace({"model": "gpt-4.1", "input": "Explain gravity in simple terms."})),
    ]:
        s.insert(rng, Row(value, quirk))
    raw = '{\n\t"model": "qwen3-8b",\n\t"messages": [{"role": "user", "content": "What is the weather\nin Oslo?"}]\n}'
    s.insert(rng, Row({"id": "req-bad-1", "endpoint": "POST http://localhost:30000/v1/chat/completions", "body": None,
                       "body_raw": raw, "parse_error": "Invalid control character at: line 3 column 68 (char 89)"},
                      "unparsed_body"))
    s.insert(rng, Row('{"id": "req-trunc-1", "endpoint": "POST http://localhost:30000/v1/chat/completions", '
                      '"body": {"model": "qwen3-8b", "messages": [{"role": "user", "content": "What is 10% of', "broken_json", raw=True))
    s.insert(rng, Row('{"id": "req-trunc-2", "body": {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]}}}',
                      "broken_json", raw=True))
    s.insert(rng, Row("HTTP/1.1 502 Bad Gateway", "broken_json", raw=True))
    return s


# ------------------------------------------------------------------ appended rows (more distinct prompts)
#
# Rows appended at the end of each file, after the quirks, from their own rng: every earlier line and quirk keeps its
# bytes and its line number. They add content the first rows never have (new concepts, code tasks, question
# families, tools), so that their prompts survive the prompt stage's exact and near-duplicate removal: the held-out
# evaluation takes 104 distinct prompts per source (blend.eval: 24 dev + 80 test) and the blend still needs the rest.
# No quirks among them.

CONCEPTS2 = [  # term, definition, example: never in CONCEPTS, so no explanation repeats an earlier row
    ("erosion", "the slow wearing away of rock and soil by water and wind", "a river carving a canyon over many years"),
    ("a habitat", "the natural home where an animal or plant lives", "a coral reef that shelters many fish"),
    ("supply and demand", "the idea that prices rise when many people want something that is scarce",
     "concert tickets costing more when a popular band plays"),
    ("a budget", "a plan for how to spend and save money over a period of time", "setting aside money each month for rent and food"),
    ("condensation", "the change of a gas into a liquid when it cools", "water drops forming on a cold glass"),
    ("a noun", "a word that names a person or a thing", "the word city in the sentence the city is busy"),
    ("the water cycle", "the journey of water from the sea to the sky and back as rain",
     "rain filling a lake that later evaporates"),
    ("a database", "an organised collection of data that a program can search and update",
     "a library system that stores every book and who borrowed it"),
    ("an atom", "the smallest unit of a chemical element", "a single atom of oxygen in the air you breathe"),
    ("a metaphor", "a figure of speech that describes something by calling it something else",
     "saying that time is a thief"),
    ("a loop", "a part of a program that repeats a block of code while a condition holds",
     "printing the numbers from one to ten"),
    ("a volcano", "an opening in the crust of the Earth where melted rock comes out", "lava flowing down a mountain in Hawaii"),
    ("magnetism", "the force that pulls iron objects toward a magnet", "a fridge magnet holding up a note"),
    ("a vaccine", "a substance that trains the immune system to fight a disease", "a flu shot given before winter"),
    ("an election", "a process in which people vote to choose a leader or a policy", "students voting for a class president"),
    ("encryption", "the scrambling of data so that only someone with the key can read it",
     "a messaging app that hides your messages from others"),
    ("a food chain", "the order in which living things eat one another to get energy",
     "grass eaten by a rabbit that is eaten by a fox"),
    ("a renewable resource", "a resource that nature replaces as fast as people use it", "wind turning a wind turbine"),
    ("opportunity cost", "the value of the best choice you give up when you make a decision",
     "missing a movie because you chose to study"),
    ("a hypothesis", "an idea that a scientist tests with an experiment", "guessing that plants grow faster with more light"),
    ("an API", "a set of rules that lets one program ask another program for data or actions",
     "a weather app asking a server for the forecast"),
    ("a tectonic plate", "a huge slab of the Earth's crust that slowly moves", "two plates pushing up a mountain range"),
    ("an immune response", "the way the body finds and fights germs", "a fever while the body fights a cold"),
    ("a prime number", "a whole number greater than one that only one and itself divide",
     "the number seven, which nothing else divides evenly"),
]
EXPLAIN2 = ["Explain {t} in simple terms.", "What is {t}?", "Can you explain what {t} means?",
            "Describe {t} in a few sentences.", "I keep hearing about {t}. What does it mean?"]
GOALS2 = {
    "eating more healthily": ["Add a vegetable to every meal.", "Drink water instead of soda.", "Plan your meals for the week.",
                              "Keep fruit where you can see it.", "Cook with less salt and sugar."],
    "getting fit at home": ["Start with ten minutes of exercise a day.", "Do push-ups and squats between tasks.",
                            "Follow a short video workout.", "Walk during phone calls.", "Track your workouts in a notebook."],
    "reading more books": ["Carry a book with you everywhere.", "Read ten pages before bed.", "Join a book club.",
                           "Keep a list of books you want to read.", "Swap some screen time for reading."],
    "keeping a tidy home": ["Put things back right after you use them.", "Clean one small area each day.",
                            "Give away things you do not use.", "Make your bed every morning.", "Wash the dishes after each meal."],
    "making new friends in a new city": ["Join a club or a sports team.", "Say yes to invitations.", "Take a class you enjoy.",
                                         "Volunteer for a local cause.", "Talk to your neighbours."],
    "preparing for a job interview": ["Research the company before the interview.", "Practice answers out loud.",
                                      "Prepare two questions to ask them.", "Plan your route and arrive early.",
                                      "Bring a copy of your CV."],
}
TIPS2 = ["Give me three tips for {g}.", "What are three good tips for {g}?", "How can I get better at {g}? Three tips, please."]
PAIRS2 = [  # a, b, field, what a does, what b does: never in PAIRS
    ("array", "linked list", "data structures", "stores its items next to each other in memory",
     "stores each item with a link to the next one"),
    ("atom", "molecule", "chemistry", "is a single particle of an element", "is two or more atoms bonded together"),
    ("debit card", "credit card", "personal finance", "spends money that is already in your account",
     "borrows money that you pay back later"),
    ("simile", "metaphor", "writing", "compares two things using like or as", "says that one thing is another"),
    ("mitosis", "meiosis", "biology", "makes two identical cells", "makes four cells with half the chromosomes"),
    ("class", "object", "object-oriented programming", "is a blueprint that describes data and behaviour",
     "is one concrete thing built from that blueprint"),
    ("renewable resource", "non-renewable resource", "environmental science", "is replaced by nature as fast as we use it",
     "takes millions of years to form again"),
    ("primary key", "foreign key", "databases", "identifies each row of its own table",
     "points to the primary key of another table"),
    ("conductor", "insulator", "physics", "lets electricity flow through it easily", "blocks the flow of electricity"),
    ("asteroid", "comet", "astronomy", "is a rocky body that mostly orbits between Mars and Jupiter",
     "is an icy body that grows a tail near the Sun"),
]


def explain2(rng: random.Random) -> tuple[str, str, tuple]:
    """As :func:`explain`, over CONCEPTS2 and EXPLAIN2."""
    term, definition, example = c = pick(rng, CONCEPTS2)
    a = (f"{term[0].upper() + term[1:]} is {definition}. A simple example is {example}. "
         f"In short, {term} is {definition.split(',')[0]}.")
    return pick(rng, EXPLAIN2).format(t=term), a, c


def compare2(rng: random.Random) -> tuple[str, str]:
    """As :func:`compare`, over PAIRS2, with a third phrasing."""
    a, b, fld, da, db = pick(rng, PAIRS2)
    q = pick(rng, ["What is the difference between a {a} and a {b} in {f}?", "In {f}, how does a {a} differ from a {b}?",
                   "I am learning {f}. Can you tell me how a {a} and a {b} are different?"]).format(a=a, b=b, f=fld)
    ans = (f"A {a} {da}, while a {b} {db}. Use a {a} when that behaviour is what you need, "
           f"and a {b} otherwise. In short, the main difference is that a {a} {da}.")
    return q, ans


# Worked numeric questions, one family a tuple of (question phrasings, worked answer), slots drawn by `numeric`.
# Their numbers are part of the problem: the sources that keep numbers exact in dedup (WebInstruct, traces) keep
# each as its own prompt; the families and phrasings are new, so none equals an earlier row.
UNITS = [("kilometers", "meters", 1000), ("hours", "minutes", 60), ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
         ("feet", "inches", 12), ("days", "hours", 24), ("minutes", "seconds", 60), ("yards", "feet", 3)]


def numeric(rng: random.Random) -> tuple[str, str]:
    """A worked numeric question: rectangle area, simple interest, average, speed, unit conversion, polygon angles."""
    k = rng.randrange(6)
    if k == 0:
        w, h = rng.randint(2, 30), rng.randint(2, 30)
        q = pick(rng, ["What is the area of a rectangle that is {w} cm long and {h} cm wide?",
                       "A rectangular garden measures {w} cm by {h} cm. How large is its area?"])
        return (q.format(w=w, h=h), f"The area of a rectangle is its length times its width.\nA = {w} * {h} = {w * h}.\n"
                                    f"So the area is {w * h} square centimeters.")
    if k == 1:
        p, r, t = rng.randint(1, 50) * 100, rng.randint(1, 9), rng.randint(1, 6)
        q = pick(rng, ["How much simple interest does ${p} earn at {r}% per year in {t} years?",
                       "If you deposit ${p} at a simple interest rate of {r}% a year, how much interest do you earn after {t} years?"])
        return (q.format(p=p, r=r, t=t), f"Simple interest is I = P * r * t.\nI = {p} * {r}/100 * {t} = {p * r * t // 100}.\n"
                                         f"So the interest is ${p * r * t // 100}.")
    if k == 2:
        xs = [rng.randint(1, 50) for _ in range(3)]
        xs.append(4 * rng.randint(max(1, (sum(xs) + 4) // 4), (sum(xs) + 50) // 4) - sum(xs))  # the mean is a whole number
        listed = ", ".join(map(str, xs[:-1])) + f" and {xs[-1]}"
        q = pick(rng, ["What is the average of {l}?", "Find the mean of the numbers {l}."]).format(l=listed)
        return q, (f"The average is the sum divided by the count.\nSum: {' + '.join(map(str, xs))} = {sum(xs)}.\n"
                   f"Average: {sum(xs)} / 4 = {sum(xs) // 4}.\nSo the average is {sum(xs) // 4}.")
    if k == 3:
        v, t = rng.randint(4, 24) * 5, rng.randint(2, 6)
        q = pick(rng, ["A car travels {d} km in {t} hours. What is its average speed?",
                       "How fast is a train going on average if it covers {d} km in {t} hours?"])
        return (q.format(d=v * t, t=t), f"Average speed is distance divided by time.\nv = {v * t} / {t} = {v}.\n"
                                        f"So the average speed is {v} km per hour.")
    if k == 4:
        big, small, f = pick(rng, UNITS)
        n = rng.randint(2, 40)
        q = pick(rng, ["How many {s} are in {n} {b}?", "Convert {n} {b} to {s}."]).format(s=small, n=n, b=big)
        return q, (f"There are {f} {small} in one {big[:-1]}.\nSo {n} {big} is {n} * {f} = {n * f} {small}.\n"
                   f"The answer is {n * f} {small}.")
    n = rng.randint(5, 20)
    q = pick(rng, ["What is the sum of the interior angles of a polygon with {n} sides?",
                   "How many degrees do the inside angles of a {n}-sided polygon add up to?"]).format(n=n)
    return q, (f"A polygon with n sides has interior angles that add up to (n - 2) * 180 degrees.\n"
               f"({n} - 2) * 180 = {n - 2} * 180 = {(n - 2) * 180}.\nSo the angles add up to {(n - 2) * 180} degrees.")


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _words_example(r: random.Random) -> str:
    return pick(r, ["the cat sat on the mat", "good morning to you", "hello world", "we love clean code",
                    "the quick brown fox jumps", "time to go home"])


CODE2 = [  # new function tasks: never in CODE, so no query repeats an earlier row; each example is checked by the code
    CodeTask(["count_words", "word_count"], "counts the words in a sentence",
             "splits the sentence on spaces and counts the pieces that are not empty",
             "def {fn}(text):\n    return len([w for w in text.split(\" \") if w])",
             "function {fn}(text) {{\n  return text.split(\" \").filter((w) => w.length > 0).length;\n}}",
             lambda r: (lambda s: (json.dumps(s), str(len(s.split()))))(_words_example(r))),
    CodeTask(["is_palindrome", "check_palindrome"], "checks whether a word reads the same backwards",
             "compares the word with its reverse",
             "def {fn}(word):\n    return word == word[::-1]",
             "function {fn}(word) {{\n  return word === word.split(\"\").reverse().join(\"\");\n}}",
             lambda r: (lambda w: (json.dumps(w), str(w == w[::-1])))(pick(r, ["level", "radar", "kayak", "noon", "apple", "river", "paris"]))),
    CodeTask(["find_min", "smallest", "min_value"], "returns the smallest number in a list",
             "keeps the smallest value seen so far while it walks the list",
             "def {fn}(numbers):\n    best = numbers[0]\n    for n in numbers:\n        if n < best:\n            best = n\n    return best",
             "function {fn}(numbers) {{\n  let best = numbers[0];\n  for (const n of numbers) {{\n    if (n < best) {{\n      best = n;\n    }}\n  }}\n  return best;\n}}",
             lambda r: (lambda xs: (str(xs), str(min(xs))))(_nums(r))),
    CodeTask(["fibonacci", "fib"], "returns the n-th Fibonacci number",
             "starts from 0 and 1 and adds the last two numbers n times",
             "def {fn}(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
             "function {fn}(n) {{\n  let a = 0;\n  let b = 1;\n  for (let i = 0; i < n; i++) {{\n    [a, b] = [b, a + b];\n  }}\n  return a;\n}}",
             lambda r: (lambda n: (str(n), str(_fib(n))))(r.randint(3, 15))),
    CodeTask(["gcd", "greatest_common_divisor"], "returns the greatest common divisor of two positive integers",
             "replaces the pair by the smaller number and the remainder until the remainder is zero",
             "def {fn}(a, b):\n    while b != 0:\n        a, b = b, a % b\n    return a",
             "function {fn}(a, b) {{\n  while (b !== 0) {{\n    [a, b] = [b, a % b];\n  }}\n  return a;\n}}",
             lambda r: (lambda g, p, q: (f"{g * p}, {g * q}", str(gcd(g * p, g * q))))(r.randint(2, 9), r.randint(1, 7), r.randint(1, 7))),
    CodeTask(["remove_duplicates", "unique_items"], "removes repeated numbers from a list and keeps the first of each",
             "adds each number to a new list only if it is not there yet",
             "def {fn}(numbers):\n    seen = []\n    for n in numbers:\n        if n not in seen:\n            seen.append(n)\n    return seen",
             "function {fn}(numbers) {{\n  const seen = [];\n  for (const n of numbers) {{\n    if (!seen.includes(n)) {{\n      seen.push(n);\n    }}\n  }}\n  return seen;\n}}",
             lambda r: (lambda xs: (str(xs), str(list(dict.fromkeys(xs)))))([r.randint(1, 6) for _ in range(r.randint(4, 6))])),
    CodeTask(["capitalize_words", "title_case"], "capitalizes the first letter of every word in a sentence",
             "upper-cases the first letter of each word and joins the words back with spaces",
             "def {fn}(text):\n    return \" \".join(w[:1].upper() + w[1:] for w in text.split(\" \"))",
             "function {fn}(text) {{\n  return text.split(\" \").map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join(\" \");\n}}",
             lambda r: (lambda s: (json.dumps(s), json.dumps(" ".join(w[:1].upper() + w[1:] for w in s.split(" ")))))(_words_example(r))),
    CodeTask(["sum_digits", "digit_sum"], "returns the sum of the digits of a non-negative integer",
             "adds the last digit and drops it until the number is zero",
             "def {fn}(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total",
             "function {fn}(n) {{\n  let total = 0;\n  while (n > 0) {{\n    total += n % 10;\n    n = Math.floor(n / 10);\n  }}\n  return total;\n}}",
             lambda r: (lambda n: (str(n), str(sum(map(int, str(n))))))(r.randint(10, 9999))),
    CodeTask(["is_leap_year", "leap_year"], "checks whether a year is a leap year",
             "tests divisibility by 4, 100 and 400 in the order the calendar rule gives",
             "def {fn}(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
             "function {fn}(year) {{\n  return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);\n}}",
             lambda r: (lambda y: (str(y), str(y % 4 == 0 and (y % 100 != 0 or y % 400 == 0))))(pick(r, [1900, 1996, 2000, 2023, 2024, 2100]))),
    CodeTask(["square_all", "squares"], "returns the square of every number in a list",
             "multiplies each number by itself and collects the results in a new list",
             "def {fn}(numbers):\n    return [n * n for n in numbers]",
             "function {fn}(numbers) {{\n  return numbers.map((n) => n * n);\n}}",
             lambda r: (lambda xs: (str(xs), str([x * x for x in xs])))(_nums(r))),
]
ASK_CODE2 = ["Write a {L} function called `{fn}` that {d}.", "Implement `{fn}` in {L}: it {d}.",
             "I need a {L} function that {d}. Please name it `{fn}`.", "Show me a {L} function `{fn}` which {d}."]


def code_task2(rng: random.Random) -> tuple[str, str, str]:
    """As :func:`code_task`, over CODE2, and SQL queries that sort, count and average (the first rows only filter)."""
    if rng.random() < 0.2:
        table, cols = pick(rng, TABLES)
        col, n = pick(rng, cols), rng.randint(2, 20)
        k = rng.randrange(3)
        if k == 0:
            q = pick(rng, ["Write a SQL query that returns the {n} {t} with the highest {c}.",
                           "How do I get the top {n} {t} by {c} in SQL?"]).format(n=n, t=table, c=col)
            sql, what = f"SELECT *\nFROM {table}\nORDER BY {col} DESC\nLIMIT {n};", f"the {n} rows of `{table}` with the highest `{col}`"
        elif k == 1:
            n *= 10
            q = pick(rng, ["Write a SQL query that counts the {t} whose {c} is below {n}.",
                           "How many {t} have a {c} under {n}? Write the SQL."]).format(n=n, t=table, c=col)
            sql, what = f"SELECT COUNT(*)\nFROM {table}\nWHERE {col} < {n};", f"how many rows of `{table}` have a `{col}` below {n}"
        else:
            n *= 10
            q = pick(rng, ["Write a SQL query for the average {c} of the {t} with a {c} of at least {n}.",
                           "In SQL, how do I average the {c} over all {t} whose {c} is {n} or more?"]).format(n=n, t=table, c=col)
            sql, what = (f"SELECT AVG({col})\nFROM {table}\nWHERE {col} >= {n};",
                         f"the average `{col}` of the rows of `{table}` whose `{col}` is at least {n}")
        return q, f"You can use the following query:\n\n```sql\n{sql}\n```\n\nThis query returns {what}.", "sql"
    t = pick(rng, CODE2)
    lang = pick(rng, ["python", "python", "javascript"])
    fn = pick(rng, t.fn)
    if lang == "javascript":
        fn = fn.split("_")[0] + "".join(p.title() for p in fn.split("_")[1:])
    arg, res = t.example(rng)
    if lang == "javascript":
        res = res.lower() if res in ("True", "False") else res
    q = pick(rng, ASK_CODE2).format(L=LANGS[lang], fn=fn, d=t.desc)
    code = (t.py if lang == "python" else t.js).format(fn=fn)
    a = (f"Here is a {LANGS[lang]} function that {t.desc}:\n\n```{lang}\n{code}\n```\n\n"
         f"It {t.how}. For example, `{fn}({arg})` returns `{res}`.")
    return q, a, lang


EXTRA_CATEGORIES = {"get_directions": ("Travel", "Navigation", "Route Planning"),
                    "search_recipes": ("Food", "Recipes", "Recipe Search"),
                    "get_movie_showtimes": ("Entertainment", "Movies", "Showtimes"),
                    "set_reminder": ("Productivity", "Reminders", "Set Reminder"),
                    "book_hotel": ("Travel", "Hotels", "Hotel Booking"),
                    "find_events": ("Entertainment", "Events", "Event Search"),
                    "recommend_books": ("Media", "Books", "Book Recommendation")}


def more_infinity(rng: random.Random, s: Sample) -> None:
    n = max(r.value["id"] for r in s.rows if not r.raw)  # ids go on from the last one

    def add(convs, kind, source="Subjective"):
        nonlocal n
        n += 1
        ab, ab_zh, cat, cat_zh = LABELS[kind]
        s.add({"id": n, "conversations": convs,
               "label": {"ability_en": [ab], "ability_zh": [ab_zh], "cate_ability_en": [cat], "cate_ability_zh": [cat_zh]},
               "langdetect": "en", "source": source, "reward": rng.randint(-80, 100) / 4})

    def h(v): return {"from": "human", "value": v}
    def g(v): return {"from": "gpt", "value": v}

    for _ in range(190):  # the first rows' shapes (system turn, follow-up turn), new concepts, goals and pairs
        k = rng.random()
        if k < 0.6:
            q, a, (term, definition, example) = explain2(rng)
            convs = [h(q), g(a)]
            if rng.random() < 0.35:
                convs += [h(pick(rng, ["Can you give another example?", "Give me an example."])),
                          g(f"Sure. Another example of {term} is {example}. It shows {definition.split(',')[0]}.")]
            if rng.random() < 0.2:
                convs.insert(0, {"from": "system", "value": pick(rng, SYSTEM_PROMPTS)})
            add(convs, "explain")
        elif k < 0.8:
            goal = pick(rng, list(GOALS2))
            tips = rng.sample(GOALS2[goal], 3)
            convs = [h(pick(rng, TIPS2).format(g=goal)), g(f"Here are three tips for {goal}:\n1. {tips[0]}\n2. {tips[1]}\n3. {tips[2]}")]
            if rng.random() < 0.3:
                convs += [h("Which one is the most important?"), g(f"If you only pick one, start with this: {tips[0]}")]
            add(convs, "tips")
        else:
            q, a = compare2(rng)
            add([{"from": "system", "value": SYSTEM_PROMPTS[0]}, h(q), g(a)], "explain", source="OpenHermes-2.5")


def more_webinstruct(rng: random.Random, s: Sample) -> None:
    for _ in range(160):
        k = rng.random()
        if k < 0.6:
            (q, a), src = numeric(rng), ("socratic" if rng.random() < 0.6 else "mathstackexchange")
        else:
            (q, a), src = compare2(rng), "stackexchange"
        s.add({"question": q, "answer": a, "source": src})


def more_codefeedback(rng: random.Random, s: Sample) -> None:
    for _ in range(200):
        q, a, lang = code_task2(rng)
        s.add({"query": q, "answer": a, "resource": pick(rng, ["evolinstruct", "magicoder", "codealpaca", "wizardcoder"]),
               "lang": lang})


def more_hermes(rng: random.Random, s: Sample) -> None:
    def call_text(task):
        return "<tool_call>\n" + repr({"arguments": task["args"], "name": task["name"]}) + "\n</tool_call>\n"

    def response(task):
        return "<tool_response>\n" + json.dumps({"name": task["name"], "content": task["result"]}) + "\n</tool_response>\n"

    for _ in range(130):
        names = rng.sample(EXTRA_NAMES, rng.randint(1, 3))
        task = extra_tool_task(rng, names)
        convs = [{"from": "system", "value": hermes_system(names)}, {"from": "human", "value": task["user"]},
                 {"from": "gpt", "value": call_text(task)}, {"from": "tool", "value": response(task)},
                 {"from": "gpt", "value": task["answer"]}]
        if rng.random() < 0.15 and len(names) > 1:  # a second request in the same conversation
            t2 = extra_tool_task(rng, names)
            convs += [{"from": "human", "value": "Thanks. " + t2["user"]}, {"from": "gpt", "value": call_text(t2)},
                      {"from": "tool", "value": response(t2)}, {"from": "gpt", "value": t2["answer"]}]
        cat, sub, tk = EXTRA_CATEGORIES[task["name"]]
        s.add({"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "conversations": convs,
               "category": cat, "subcategory": sub, "task": tk})


def more_agent(rng: random.Random, s: Sample) -> None:
    reason_sys = ("You are a methodical and expert assistant. Your primary goal is to solve user requests by leveraging "
                  "a set of available tools. You must reason for the best course of action in a structured manner before responding.")
    for i in range(140):  # both shapes, alternating: sharegpt turns, then typed content parts
        names = rng.sample(EXTRA_NAMES, rng.randint(1, 3))
        task = extra_tool_task(rng, names)
        name, call = task["name"], json.dumps({"name": task["name"], "arguments": task["args"]}, ensure_ascii=False)
        if i % 2 == 0:
            convs = [{"from": "human", "value": task["user"]}, {"from": "function_call", "value": call},
                     {"from": "observation", "value": json.dumps(task["result"], ensure_ascii=False)},
                     {"from": "gpt", "value": task["answer"]}]
            if rng.random() < 0.15:  # a request no tool serves (a hotel is one when book_hotel is offered)
                asks = ["Can you also order a taxi for me?"] + (["Could you book a hotel room too?"] if "book_hotel" not in names else [])
                convs += [{"from": "human", "value": pick(rng, asks)},
                          {"from": "gpt", "value": "I'm sorry, but I can't do that because I don't have a tool for it. "
                                                   "I can only help with the functions I have been given."}]
            s.add({"conversations": convs, "tools": json.dumps([glaive_tool(n) for n in names], ensure_ascii=False)})
            continue
        msgs = [{"role": "system", "content": [{"type": "text", "value": reason_sys}]},
                {"role": "user", "content": [{"type": "text", "value": task["user"]}]},
                {"role": "assistant", "content": [
                    {"type": "reasoning", "value": f"The user wants help with this request. The {name} tool can answer it, "
                                                   f"so I will call it with {json.dumps(task['args'], ensure_ascii=False)}."},
                    {"type": "tool_call", "value": call}]},
                {"role": "tool", "content": [{"type": "text", "value": json.dumps([{"name": name, "content": task["result"]}],
                                                                                 ensure_ascii=False)}]},
                {"role": "assistant", "content": [
                    {"type": "reasoning", "value": f"The {name} tool returned the result. I can now answer the user directly."},
                    {"type": "text", "value": task["answer"]}]}]
        s.add({"messages": msgs, "tools": json.dumps([llamafactory_tool(n) for n in names], ensure_ascii=False)})


def more_traces(rng: random.Random, s: Sample) -> None:
    # Request ids go on from the last numbered one (the quirk rows' req-bad-1 / req-trunc-N are not numbered).
    n = max(int(r.value["id"][4:]) for r in s.rows if not r.raw and r.value["id"][4:].isdigit())
    city_sys = ("You are a city guide assistant for the Draftline demo app. Call a tool whenever one can answer the "
                "request, and answer in one or two sentences.")

    for _ in range(130):  # the first rows' shapes: string / list content, system prompt, multi-turn, tools, images
        n += 1
        k = rng.random()
        opts = {}
        if rng.random() < 0.6:
            opts["max_tokens"] = pick(rng, [128, 256, 512, 1024])
        if rng.random() < 0.4:
            opts["temperature"] = pick(rng, [0.0, 0.2, 0.7, 1.0])
        model = pick(rng, ["qwen3-8b", "Qwen/Qwen3-32B", "gpt-4o-mini"])
        if k < 0.45:  # the city-guide system prompt in front of distinct requests, with the 2-4 tools the app picked
            names = rng.sample(EXTRA_NAMES, rng.randint(2, 4))
            task = extra_tool_task(rng, names)
            body = {"model": model, "messages": [{"role": "system", "content": city_sys}, {"role": "user", "content": task["user"]}],
                    "tools": [openai_tool(t) for t in names], "tool_choice": "auto", **opts}
        elif k < 0.65:
            body = {"model": model, "messages": [{"role": "user", "content": numeric(rng)[0]}], **opts}
        elif k < 0.75:
            body = {"model": model, "messages": [{"role": "system", "content": pick(rng, SYSTEM_PROMPTS)},
                                                 {"role": "user", "content": numeric(rng)[0]}], **opts}
        elif k < 0.85:
            body = {"model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": numeric(rng)[0]}]}], **opts}
        elif k < 0.92:  # a photo of the exercise beside its text
            url = TINY_PNG if rng.random() < 0.4 else f"https://images.example.com/homework-{rng.randint(1, 999)}.jpg"
            body = {"model": model, "messages": [{"role": "user", "content": [
                {"type": "text", "text": numeric(rng)[0] + " The photo shows my working."},
                {"type": "image_url", "image_url": {"url": url}}]}], **opts}
        else:
            q, a = numeric(rng)
            body = {"model": model, "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a},
                                                 {"role": "user", "content": "Can you check that answer another way?"}], **opts}
        if rng.random() < 0.1:
            body["stream"] = True
        s.add({"id": f"req-{n:05d}", "endpoint": pick(rng, ["POST http://localhost:30000/v1/chat/completions",
                                                             "POST https://api.example.com/v1/chat/completions"]),
               "body": body})


MORE = {
    "infinity_instruct": more_infinity,
    "webinstructsub": more_webinstruct,
    "codefeedback": more_codefeedback,
    "hermes_fc": more_hermes,
    "agent": more_agent,
    "http_traces": more_traces,
}

MAKERS = {
    "infinity_instruct": make_infinity,
    "webinstructsub": make_webinstruct,
    "codefeedback": make_codefeedback,
    "metamathqa": make_metamath,
    "hermes_fc": make_hermes,
    "agent": make_agent,
    "http_traces": make_traces,
}


# ------------------------------------------------------------------ benchmark sets (evaluate.sets)

def make_gsm8k(rng: random.Random, n: int = 24) -> list[dict[str, Any]]:
    """openai/gsm8k (main, test): ``question`` and ``answer`` (worked solution, then ``#### <number>``)."""
    rows, seen = [], set()
    while len(rows) < n:
        t = rng.randrange(len(GSM))
        slots = gsm_slots(rng, t)
        question = GSM[t].question.format(**slots)
        if question in seen:  # every benchmark question distinct: a repeat is drawn again
            continue
        seen.add(question)
        rows.append({"question": question, "answer": GSM[t].steps.format(**slots) + f"\n#### {slots['ans']}"})
    return rows


def make_mt_bench(rng: random.Random, n: int = 24) -> list[dict[str, Any]]:
    """HuggingFaceH4/mt_bench_prompts (train): ``prompt`` is a list of two user turns, the second building on the
    reply to the first; ``category`` and ``reference`` (answers for math and coding, else empty)."""
    rows, seen = [], set()
    topics = sorted(GOALS)
    while len(rows) < n:
        if len(rows) == 8:  # the first 8 rows drew their topics from GOALS alone (they keep their bytes); 5 are too few
            topics = sorted(GOALS) + sorted(GOALS2)
        if rng.random() < 0.5:
            topic = pick(rng, topics)
            turns = [f"Give me some tips for {topic}.", "Now rewrite your answer as a short list of three points."]
            category = "writing"
        else:
            q, _, _ = math_problem(rng)
            turns = [q, "Explain the same solution to a ten-year-old."]
            category = "math"
        if turns[0] in seen:  # every benchmark prompt distinct: a repeat is drawn again
            continue
        seen.add(turns[0])
        rows.append({"prompt": turns, "prompt_id": 81 + len(rows), "category": category, "reference": []})
    return rows


BENCHMARKS = {"gsm8k": make_gsm8k, "mt_bench": make_mt_bench}


def write_benchmarks(out: Path) -> None:
    """benchmarks/<set>.jsonl: small stand-ins for the sets model cards report, in their real schemas."""
    (out / "benchmarks").mkdir(exist_ok=True)
    for i, (name, make) in enumerate(BENCHMARKS.items()):
        rows = make(random.Random(SEED + 100 + i))
        (out / "benchmarks" / f"{name}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"benchmarks/{name}: {len(rows)} lines")


def main(out: Path = HERE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for i, (name, make) in enumerate(MAKERS.items()):
        sample = make(random.Random(SEED + i))
        if name in MORE:  # appended after every quirk, from their own rng: earlier lines keep their bytes and numbers
            MORE[name](random.Random(SEED + 1000 + i), sample)
        rows, quirks = sample.write(out, name)
        manifest[name] = {"rows": rows, "quirks": dict(sorted(quirks.items()))}
        print(f"{name}: {rows} lines, {(out / f'{name}.jsonl').stat().st_size / 1e6:.2f} MB")
    (out / "quirks.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    write_benchmarks(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: beside this script)")
    main(parser.parse_args().out)
