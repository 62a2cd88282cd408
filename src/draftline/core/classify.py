"""What a prompt is about (its domain) and what language it is written in: the mix by content, not by source.

A source label does not say what its rows are: Infinity-Instruct alone spans code, math and chat, and the reference
run's 902K-row set turned out to be 77% code only when it was read. So every prompt (the prompt stage's records, a
base's rows decoded from their tokens) gets a **domain** and a **language** here, by the same rules.

Domains (:data:`DOMAINS`), decided by the first rule that fires, in this order:

1. ``tool_use``: the prompt offers tools (a ``tools`` list, a ``<tools>`` block or OpenAI function specs in the
   system prompt as a chat template renders them; in a system prompt also a bare JSON function spec with its
   ``"parameters"``, glaive's "access to the following functions", a ReAct tool list with ``Action Input:``) or
   already holds tool calls or tool results. The reply a drafter learns there is a tool call or an answer built on
   a tool result, whatever the question is about: "how much should I tip on $104" with a calculator offered is a
   tool-use row, not arithmetic. First, because it is the only rule that reads structure, never words.
2. ``code``: the user's text holds code or asks for it: a code fence, a line that reads as code (``def``,
   ``class``, ``#include``, ``import``, ``SELECT ... FROM``, a statement ending in ``;`` or ``{``, a diff, SQL
   joins), what a program prints (an exception class, a traceback, a segfault, a command line with flags), a
   programming language or a coding tool named (Python, SQL, GLSL, git, Linux, cron, pytest, VBA...), a regular
   expression or a spreadsheet formula / macro, "this code" asked about, or a request to write / implement / debug
   a function, script, program, query or algorithm, in English or another language (a verb and a thing made of
   code, both needed). Before math, because a coding task about numbers (a factorial function, pi by Leibniz)
   is answered in code, and code dominates a drafter's acceptance there.
3. ``math``: LaTeX (``$...$``, ``\\frac``, ``\\sqrt``), an equation or a power (``4y + 3 = 35``, ``x² − 5x``,
   ``f(x) =``, ``lim``), a number problem (a number and a calculation cue: how many, how much, calculate, solve,
   percent...; or the same cue in one of 20 other languages: combien, berechne, сколько, 多少, 求...), or a question
   about a mathematical notion or a proof (fraction, median, probability, derivative, hypotenuse, "prove that"...;
   in English and the same 20 languages). Replies here are worked arithmetic.
4. ``general``: everything else (explanations, writing, advice, reading comprehension, science in words).

Languages are ISO 639-1 codes from py3langid, a pure-Python port of langid.py that ships its model inside the
package (nothing is downloaded; it runs offline, ~30 us a prompt), restricted to the 116 languages of its model
that have a two-letter code. It reads the user's text with code, LaTeX, URLs, e-mail addresses and quoted error
messages taken out (they are not natural language and pull short prompts towards random languages). An ASCII text
of which at least a fifth of the words are English function words (the, of, and, is, what, how...) is English
without asking langid: cheap, and exact on such text. Text with fewer than :data:`MIN_LETTERS` letters left (a
bare code snippet, a number) is ``und`` (ISO 639's "undetermined"). langid is unreliable on very short Latin-script
text; an ASCII-only text shorter than :data:`SHORT_TEXT` letters whose vote is not confident (normalised
probability below :data:`MIN_CONFIDENCE`) is read as English, the language such short instruction prompts are
overwhelmingly written in (measured on the hand-labelled set, tests/prompts/labels.jsonl).

Agreement with hand labels is measured by tests/prompts/test_classify.py on the labelled set (docs/prompts.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

DOMAINS = ("code", "math", "tool_use", "general")
UNDETERMINED = "und"
MIN_LETTERS = 3
SHORT_TEXT = 40
MIN_CONFIDENCE = 0.9


@dataclass(frozen=True)
class Label:
    """A prompt's domain (one of :data:`DOMAINS`) and language (ISO 639-1, or ``und``)."""

    domain: str
    lang: str


# --- tool use -------------------------------------------------------------------------------------------------
_TOOLS_IN_TEXT = re.compile(r"<tools>|\"type\"\s*:\s*\"function\"|'type'\s*:\s*'function'|<tool_call>|<tool_response>")
# Tools a system prompt offers in other shapes: a JSON function spec (glaive's "access to the following functions"
# followed by {"name", "description", "parameters"}), a ReAct tool list ("Action Input:"). Read in system text only:
# a user pasting a JSON schema is not offering tools.
_TOOLS_IN_SYSTEM = re.compile(
    r"[\"']parameters[\"']\s*:\s*\{|access to the following (?:functions|tools|apis)\b|^Action Input:", re.M
)

# --- code -----------------------------------------------------------------------------------------------------
_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(
    r"(?m)^\s*(?:def \w+\s*\(|class \w+[\s:(]|#include\s*[<\"]|import \w|from [\w.]+ import |"
    r"(?:public|private|static) [\w<>\[\]]+ \w+\s*\(|function\s*\w*\s*\(|(?:const|let|var) \w+\s*=|"
    r"SELECT\b.+\bFROM\b|CREATE TABLE\b|#!/|for \w+ in .+:\s*$|-\s.+\n\+\s)"  # ... a Python loop; a diff's -/+ lines
    r"|^.{0,200}[;{]\s*$|\{[^{}\n]*;\s*\}"  # a statement; a one-line block ({ console.log(i); })
    r"|\b(?:LEFT|RIGHT|INNER|OUTER|FULL|CROSS) JOIN\b|\bGROUP BY\b|\bORDER BY\b"  # SQL, in SQL's capitals
)
# Text a program prints, not a person: an exception class (KeyError, NullPointerException), a traceback, a crash,
# git's "fatal:"; a command line with flags (tar -xzvf, find . -name); an algorithm's big-O. Case-sensitive.
_CODE_OUTPUT = re.compile(
    r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)*(?:Error|Exception)\b|Traceback \(most recent call last\)|Segmentation fault|"
    r"core dumped|\bfatal: |(?:^|[\s:`])(?:sudo|git|tar|find|grep|sed|awk|chmod|chown|ls|rm|cp|ssh|curl|wget|docker|"
    r"kubectl|npm|pip|apt(?:-get)?|brew|systemctl|lsof|netstat|ps)\s+(?:[^\s-]+\s+)?--?[A-Za-z]|"
    r"\bO\((?:1|n|log n|n log n|n\^?2|n²)\)",
    re.M,
)
_LANGUAGES = re.compile(  # no \b: CJK text runs a name into the next word ("Pythonで")
    r"(?<![A-Za-z])(?:python|javascript|typescript|java|c\+\+|c#|golang|rust|kotlin|swift|ruby|php|perl|scala|haskell|"
    r"sql|mysql|postgresql|sqlite|html|css|bash|powershell|matlab|glsl|hlsl|verilog|vhdl|react|django|flask|"
    r"pandas|numpy|tensorflow|pytorch|regex|regular expression|systemd|dockerfile|kubernetes|c language|"
    r"git|linux|cron(?:tab)?|pytest|unittest|vba)(?![A-Za-z])"  # tools whose questions are answered in code or commands
    r"|파이썬|자바스크립트|パイソン|ジャバスクリプト"  # language names as Korean and Japanese write them
)
# A regular expression, a code repository or a spreadsheet lookup function named in other languages.
_CODE_TERMS = re.compile(
    r"expression régulière|expresi[oó]n regular|regulären? ausdruck|espressione regolare|expressão regular|"
    r"регулярн\w+ выражени|正規表現|正则表达式|정규\s?표현식|远程仓库|代码库|リポジトリ|"
    r"vert\.zoeken|buscarv|recherchev|sverweis|cerca\.vert|procv|vlookup|xlookup|sumif|countif"
)
# A spreadsheet together with a formula, a column, a cell or a macro: a formula / VBA question. The spreadsheet
# alone is not enough ("Excel skills on a CV").
_SPREADSHEET = re.compile(r"\bexcel\b|google sheets|spreadsheet|hoja de cálculo|tableur|tabellenkalkulation|"
                          r"foglio di calcolo|planilha|электронн\w+ таблиц|スプレッドシート|엑셀|电子表格")
_CELLS = re.compile(r"\b(?:formulas?|fórmulas?|formules?|formeln?|columns?|colonnes?|spalten?|columnas?|colonn[ae]|"
                    r"colunas?|cells?|celdas?|cell[ae]|células?|zellen?|macros?|makros?|tabblad|hojas?)\b|"
                    r"формул|столб|ячейк|макрос|数式|수식|公式|セル|셀|单元格|マクロ|매크로")
_CODE_ASK = re.compile(
    r"\b(?:writ(?:e|es|ing)|implement(?:s|ing)?|creat(?:e|es|ing)|code|build(?:s|ing)?|fix|debug|refactor|"
    r"optimi[sz]e|complete|convert|translate)\b[^.?!\n]{0,60}?"
    r"\b(?:function|method|script|program|class|query|algorithm|pseudo-?code|snippet|code|api|endpoint|unit tests?)\b"
    r"|\bpseudo-?code\b|\bsource code\b|\bcode snippet\b|\bcompil(?:e|er|ation) error\b|\bstack trace\b"
)
# The same request in other languages: a verb (write / implement / create) and, in either order within a sentence,
# a thing made of code. Both are needed: "funzione" alone is also a mathematical function. The word for a
# "program" is left out but in Chinese (程序): elsewhere it is as often a workout or a TV programme.
_ASK_VERBS = {
    "fr": r"écri[st]|écrire|écrivez|implémente\w*|crée[rz]?",
    "de": r"schreib\w*|implementier\w*|erstell\w*",
    "es it pt": r"escrib\w*|implementa\w*|crea\b|crear|scriv\w*|escrev\w*|cri[ea]\b",
    "ru uk": r"напиш\w*|реализу\w*|созда\w*|створ\w*",
    "ja ko zh": r"書いて|書け|実装|作成|작성|구현|만들어|写|编写|实现",
    "nl pl cs": r"schrijf|maak|napisz|zaimplementuj|utwórz|napiš\w*|vytvoř\w*",
    "tr vi ar hi fa": r"yaz\w*|oluştur\w*|viết|tạo|اكتب|أنشئ|लिख|بنویس\w*|بساز",
    "sv id": r"skriv\w*|skapa|tulis\w*|buat\w*",
}
_ASK_THINGS = {
    "function": r"fonction|functie|funktion|función|funzione|função|функци\w*|функці\w*|関数|함수|函数|funkcj\w*|"
                r"fonksiyon|hàm\b|دالة|फ़ंक्शन|fungsi|funkc\w*|تابع",
    "script, program": r"script|skript|скрипт|スクリプト|스크립트|脚本|程序",
    "query, macro": r"requête|abfrage|consulta|query|запрос|クエリ|쿼리|查询|macro|makro|макрос|マクロ|매크로",
    "code": r"code|código|codice|код|コード|코드|代码|\bkod\b|\bkód\b|کد|कोड|\bkode\b",
}
_VERB, _THING = "|".join(_ASK_VERBS.values()), "|".join(_ASK_THINGS.values())
_CODE_ASK_OTHER = re.compile(rf"(?:{_VERB})[^.?!。？！\n]{{0,60}}(?:{_THING})|(?:{_THING})[^.?!。？！\n]{{0,40}}(?:{_VERB})")
# "this code" / "the following code" in other languages: a question about code shown in the prompt ("el código",
# "il codice" alone are as often a postcode or a legal code).
_THIS_CODE = re.compile(
    r"ce code|le code suivant|diese[nrm]? code|folgenden? code|este código|questo codice|seguinte código|deze code|"
    r"этот код|этом коде|этого кода|следующий код|цей код|这段代码|这个代码|以下代码|下面的代码|このコード|次のコード|"
    r"이 코드|다음 코드|ten kod|bu kod|mã này|هذا الكود|यह कोड|den här koden|kode ini|tento kód|این کد"
)
_IDENT = re.compile(r"`[A-Za-z_][\w.]*(?:\(\))?`")  # `snake_case` / `camelCase` in backticks: a named identifier

# --- math -----------------------------------------------------------------------------------------------------
_LATEX = re.compile(r"\$[^$\n]{1,200}\$|\\(?:frac|sqrt|times|cdot|int|sum|prod|lim|le|ge|neq|pi|alpha|theta|begin)\b")
# An equation (4y + 3 = 35; 3x − 5 = 10 with a Unicode minus), a power (x^2, n², (1 + 1/n)^n; not m², a unit),
# a function defined (f(x) =), a limit (lim).
_EQUATION = re.compile(
    r"\b\d*[a-z]?\s*[-−+*/^×÷]\s*\d+[a-z]?\s*=\s*[-−]?\d|\b[a-z]\s*\^\s*\d|\d\s*[×÷]\s*\d|"
    r"(?<![A-Za-z])[a-ln-z]\s*[²³]|[\w)]\s*\^\s*[a-z(]|\b[fgh]\s*\(\s*[a-z]\s*\)\s*=|\blim\b"
)
# Not inside a word or a version (x2, v1.2), but CJK text runs a number into its words (有12个, 半径4cm).
_NUMBER = re.compile(r"(?<![A-Za-z\d_.])-?\d+(?:[.,]\d+)?%?")
_CALC_CUE = re.compile(
    r"\b(?:how many|how much|how far|how long will|how long does it take|calculate|compute|solve|evaluate|simplify|"
    r"find the (?:value|sum|product|area|perimeter|volume|slope|probability|number|limit)|what is \d|percent|per cent|"
    r"total cost|in total|left\b|remain|average|convert|ph of|moles? of)\b|%"
)
_MATH_WORDS = re.compile(
    r"\b(?:fractions?|numerator|denominator|equations?|polynomials?|derivatives?|integrals?|probability|"
    r"median|variance|standard deviation|theorem|prime numbers?|greatest common (?:divisor|factor)|least common "
    r"multiple|logarithms?|quadratic|algebra|geometry|trigonometry|calculus|matri(?:x|ces)|vectors? space|"
    r"odd numbers?|even numbers?|integer|arithmetic|factorial|permutations?|combinatorics|normali[sz]ation|"
    r"prove (?:that|the)|irrational numbers?|is irrational|hypotenuse|perimeter|circumference|real numbers|"
    r"(?:sequence|series) (?:of [\w ]+ )?converges|odds (?:that|of)|how many ways|"
    r"sum of (?:the )?(?:interior )?angles)\b"
)
# Mathematical notions in other languages, each enough on its own: probability, derivative, integral, equation,
# theorem, prime numbers, an irrational number, hypotenuse, perimeter, limit, the sum of angles, "prove that".
# A word that also has an everyday sense is bound to its mathematical use ("irrationnel" is also a fear, 极限 an
# extreme sport, 积分 loyalty points, 证明 a certificate, "całkowicie" completely) or left out (Arabic نظرية
# "theory", Swedish sats "sentence", Polish granica "border", Korean 무리수 "a rash move").
_MATH_NOTIONS = {
    "fr": r"probabilité|dérivée|intégrale|équation|théorème|nombres? premiers|nombre irrationnel|est irrationnel|"
          r"hypoténuse|périmètre|démontr\w+ que|tend vers (?:l'infini|[+-]?\d|zéro)|somme des angles",
    "de": r"wahrscheinlichkeit|ableitung|gleichung|primzahl|irrationale zahl|ist irrational|hypotenuse|"
          r"beweise, dass|beweisen sie|zeige, dass|winkelsumme|grenzwert",
    "es": r"probabilidad|derivada|ecuaci[oó]n|teorema|números primos|número irracional|es irracional|hipotenusa|"
          r"perímetro|demuestra que|límite de",
    "it": r"probabilità|derivata|integrale|equazion|numeri primi|numero irrazionale|è irrazionale|ipotenusa|"
          r"perimetro|dimostra che",
    "pt": r"probabilidade|equaç(?:ão|ões)|demonstre que|prove que",
    "ru": r"вероятност|производн|интеграл|уравнени|теорем|простых чисел|простые числа|иррациональн\w* числ|"
          r"является иррациональн|гипотенуз|периметр|предел\b|докаж\w+,? что|сумма углов",
    "uk": r"ймовірн|похідн|інтеграл|рівнянн|теорем|ірраціональн\w* числ|гіпотенуз|доведіть|доведи, що",
    "ja": r"確率|微分|導関数|積分|方程式|定理|素数|無理数|斜辺|極限|証明せよ|証明しなさい|を証明",
    "ko": r"확률|미분|도함수|적분|방정식|빗변|극한값|증명하시오|증명하라|[을를] 증명",
    "zh": r"概率|导数|定积分|不定积分|求积分|方程|质数|素数|无理数|斜边|周长|求极限|的极限|证明[:：]|求证|试证|整除",
    "nl": r"kansberekening|afgeleide|integraal|vergelijking oplossen|priemgetal|irrationeel getal|is irrationeel|"
          r"schuine zijde|bewijs dat",
    "pl": r"prawdopodobieństw|pochodn(?:a|ą|ej) funkcji|całk[aęi]\b|równani|twierdzeni|liczb\w* pierwsz|niewymiern|"
          r"przeciwprostokątn|udowodnij|suma kątów",
    "tr": r"olasılı|türev|denklem|asal sayı|irrasyonel sayı|irrasyoneldir|hipotenüs|kanıtla|ispatla",
    "vi": r"xác suất|đạo hàm|tích phân|phương trình|định lý|số nguyên tố|số vô tỉ|cạnh huyền|chứng minh rằng|"
          r"hãy chứng minh",
    "ar": r"مشتقة|معادلة|أعداد أولية|عدد غير نسبي|أثبت أن",
    "hi": r"प्रायिकता|अवकलज|समाकल|समीकरण|प्रमेय|अभाज्य|सिद्ध कीजिए",
    "sv": r"sannolikhet|derivata|ekvation|primtal|irrationellt tal|är irrationell|hypotenusa|gränsvärde|bevisa att",
    "id": r"probabilitas|bilangan prima|bilangan irasional|buktikan",
    "cs": r"pravděpodobnost|derivac|integrál|rovnic|prvočísl|iracionální číslo|je iracionální|přepon|dokažte",
    "fa": r"مشتق تابع|انتگرال|معادله|اعداد اول|ثابت کنید",
}
_MATH_WORDS_OTHER = re.compile("|".join(_MATH_NOTIONS.values()))
# A calculation asked for in other languages (calculate, how many / how much, solve, find, average speed...): like
# English's cues, it needs a number beside it. Nouns such as area, volume or radius are left out: with a number they
# are as often a fact ("an area of 357,000 km²", "within a 5 km radius"). 求 is "find" in a Chinese problem but also
# a piece of 请求 / 要求 (request, requirement); Polish "ile" is Turkish "with"; Vietnamese "tính" is also in
# máy tính (computer) and giới tính (gender): hence the look-arounds.
_CALC_ASKS = {
    "zh": r"多少|几个|计算(?!机)|(?<![请要需追寻征祈恳谋诉])求(?![助职婚救学])|面积|体积|平均",
    "ja": r"いくつ|計算|求めなさい|求めよ|求めて|何個|面積|体積|速さ",
    "ko": r"몇|계산|구하시오|구하세요|구하라|얼마|넓이|부피|속력|평균",
    "fr": r"combien|calcul\w*|résou\w*|détermine[rz]?\b|vitesse moyenne",
    "de": r"wie viele?|wie lange|berechne\w*|bestimme\b|bestimmen sie|löse\b|lösen sie|flächeninhalt|ph-wert",
    "es": r"cuánt[oa]s?|calcula\w*|(?<!se )\bhalla\b|resuelve|velocidad media",
    "it": r"quant[oiae]|calcol\w*|risolvi|velocità media",
    "pt": r"quant[oa]s?\b|resolva|velocidade média|cilindro",
    "ru uk": r"сколько|вычисли\w*|найди\w*|решите|рассчита\w*|средн\w* скорост|скільки|обчисл\w*|знайд\w*|"
             r"середн\w* швидкіст",
    "nl": r"bereken\w*|hoeveel",
    "pl": r"oblicz\w*|ile (?:wynosi|jest|kosztuj\w*|razy)|\bilu\b",
    "tr": r"hesapla\w*|\bkaç\b|ne kadar(?:dır|dir| olur| eder|\?)|bulunuz",
    "vi": r"(?<!máy )(?<!giới )\btính\b(?! cách| năng| chất)|bao nhiêu|diện tích|thể tích|chu vi|vận tốc",
    "ar": r"احسب|\bف?كم\b|أوجد",
    "hi": r"गणना|कितन|ज्ञात कीजिए|क्षेत्रफल",
    "sv": r"beräkna|hur många|hur mycket",
    "id": r"hitung\w*|berapa|tentukan",
    "cs": r"vypočít\w*|spočít\w*|kolik",
    "fa": r"محاسبه|حساب کنید|\bچقدر\b",
}
_OTHER_CALC = re.compile("|".join(_CALC_ASKS.values()))


# The word patterns above are matched against the lowercased text (3-4x faster than re.IGNORECASE).
def _has_code(text: str, low: str) -> bool:
    return bool(_FENCE.search(text) or _CODE_LINE.search(text) or _CODE_OUTPUT.search(text)
                or _LANGUAGES.search(low) or _CODE_TERMS.search(low) or _IDENT.search(text)
                or _CODE_ASK.search(low) or _CODE_ASK_OTHER.search(low) or _THIS_CODE.search(low)
                or (_SPREADSHEET.search(low) and _CELLS.search(low)))


def _has_math(text: str, low: str) -> bool:
    if _LATEX.search(text) or _EQUATION.search(text) or _MATH_WORDS.search(low) or _MATH_WORDS_OTHER.search(low):
        return True
    return bool(_NUMBER.search(text)) and bool(_CALC_CUE.search(low) or _OTHER_CALC.search(low))


def domain_of(user_text: str, tools_offered: bool) -> str:
    """The domain of a prompt whose user turns read ``user_text`` (see the module docstring for the rules)."""
    if tools_offered:
        return "tool_use"
    low = user_text.lower()
    if _has_code(user_text, low):
        return "code"
    if _has_math(user_text, low):
        return "math"
    return "general"


# --- language -------------------------------------------------------------------------------------------------
# Code, LaTeX, URLs, e-mail addresses and a quoted error message ("ReferenceError: $ is not defined": the program's
# English, not the user's language) are not the prompt's natural language.
_NOT_LANGUAGE = re.compile(
    r"```.*?(?:```|$)|`[^`\n]*`|\$[^$\n]*\$|https?://\S+|\S+@\S+\.\w+|\\[a-z]+|"
    r"(?:\b[A-Z][a-z]+ )?\b[A-Z]\w*(?:Error|Exception)\b[^\n\"«»“”„」]*",  # "Uncaught ReferenceError: ..."
    re.DOTALL,
)
_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)


@lru_cache(maxsize=1)
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    ident.set_languages([c for c in ident.nb_classes if len(c) == 2])
    return ident


# English function words: an ASCII text in which at least ENGLISH_SHARE of the words are among them is English,
# without asking langid (it costs ~200 us a prompt; this, ~10). Other languages written in ASCII share almost none
# of them ("a", "in" and "to" are excluded for that reason: Italian, Spanish, Dutch, German use them too).
_ENGLISH = frozenset(
    "the of and is are was were be been this that these those what which who whom how why when where with for from "
    "you your it its can could would should will shall do does did not have has had an as at by if or on my me we "
    "our they their them there than then into about please i he she his her".split()
)
ENGLISH_SHARE = 0.2
_WORD = re.compile(r"[a-z']+")


def _clearly_english(prose: str) -> bool:
    if not prose.isascii():
        return False
    words = _WORD.findall(prose.lower())
    return len(words) >= 4 and sum(w in _ENGLISH for w in words) >= ENGLISH_SHARE * len(words)


def language_of(text: str) -> str:
    """ISO 639-1 code of ``text``'s natural language, or ``und`` (see the module docstring)."""
    prose = _NOT_LANGUAGE.sub(" ", text)
    letters = len(_LETTER.findall(prose))
    if letters < MIN_LETTERS:
        return UNDETERMINED
    if _clearly_english(prose):
        return "en"
    lang, prob = _identifier().classify(prose)
    if lang != "en" and letters < SHORT_TEXT and prose.isascii() and prob < MIN_CONFIDENCE:
        return "en"
    return str(lang)


def classify(user_text: str, tools_offered: bool) -> Label:
    return Label(domain_of(user_text, tools_offered), language_of(user_text))


def _offers_tools(system: str) -> bool:
    return bool(_TOOLS_IN_TEXT.search(system) or _TOOLS_IN_SYSTEM.search(system))


def classify_messages(messages: Iterable[dict[str, Any]], tools: list | None) -> Label:
    """A prompt record's label: its user turns' text; tools offered by the ``tools`` list, a system prompt that
    embeds tool specs, or tool calls / results already in the prompt."""
    user, offered = [], bool(tools)
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "user":
            user.append(content)
        elif role == "tool" or m.get("tool_calls"):
            offered = True
        elif role == "system" and _offers_tools(content):
            offered = True
    return classify("\n".join(user), offered)


_CHATML_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


def classify_rendered(text: str) -> Label:
    """The label of a prompt decoded from tokens (a base's row, chat template included): ChatML turns
    (``<|im_start|>role ... <|im_end|>``, Qwen's template) are split by role; any other rendering is read whole
    as the user's text. Tools offered: a ``<tools>`` block, function specs, tool calls or tool responses anywhere,
    or a system turn that offers tools in another shape (:data:`_TOOLS_IN_SYSTEM`)."""
    turns = _CHATML_TURN.findall(text)
    offered = bool(_TOOLS_IN_TEXT.search(text))
    if not turns:
        return classify(text, offered)
    user = [c for role, c in turns if role == "user" and "<tool_response>" not in c]
    offered = offered or any(role == "tool" or (role == "system" and _offers_tools(c)) for role, c in turns)
    return classify("\n".join(user), offered)
