"""A stand-in for Tiny Shakespeare, for a clone with no copy of the text nearby and no network: made-up plays with
the structure the tests read. Speeches of 1-8 lines under a speaker header ("NAME:" in capitals, or "First
Citizen:" as the real text has too), a blank line between speeches, about 40 speakers of very unequal frequency,
lines of 20-60 characters made of words (every letter of the alphabet, in both cases), with commas, full stops,
semicolons, colons, question and exclamation marks and apostrophes. Not Shakespeare: a test that needs the real
statistics of the text reads ../shared's copy instead (tests/conftest.py)."""
import random

SPEAKERS = ["GLOUCESTER", "KING RICHARD III", "MENENIUS", "CORIOLANUS", "ROMEO", "JULIET", "DUKE VINCENTIO",
            "LUCIO", "ISABELLA", "KING HENRY VI", "QUEEN MARGARET", "WARWICK", "PETRUCHIO", "KATHARINA", "TRANIO",
            "BUCKINGHAM", "CLARENCE", "LEONTES", "PAULINA", "POLIXENES", "CAMILLO", "AUTOLYCUS", "NURSE", "MERCUTIO",
            "CAPULET", "BENVOLIO", "FRIAR LAURENCE", "ANGELO", "ESCALUS", "YORK", "NORTHUMBERLAND", "BOLINGBROKE",
            "JOHN OF GAUNT", "QUEEN ELIZABETH", "HASTINGS", "VOLUMNIA", "SICINIUS", "BRUTUS", "AUFIDIUS", "MARCIUS",
            "RICHARD", "First Citizen", "Second Citizen", "All"]
WORDS = """the and to of i you my a that in is not with it me be his your this but he have as so will what her
thy thou all by no do shall if are we him our on or now lord good come king sir more they let then from o how
well would at here am love upon which when there like know may make man too yet one such hath say am now must
give see heart night day eyes death father mother son brother blood hand head life honour grace noble gentle
sweet fair true dear poor heaven earth crown sword queen duke prince england france rome citizens people war
peace tongue word name speak tell hear stay go away again never ever still first last old young great little
quick quiet question quarrel queen's zeal zounds lazy frozen amaze vex vexed exile next fox wax six jest joy
judge justice jealous knave knight kneel keep kind kiss xerxes' ox box mix yonder yield youth yours wherefore
thee art doth hence whence thither whither nay ay fie alas anon ere oft methinks prithee forsooth marry
banish battle bear bid bless blush bosom brave breath bright bring cause charge child cloud cold counsel
court curse dare deed deep desire die dream dust ear eat end enemy envy fall fame fear feast fight fire flesh
flower fool fortune friend gold grave grief guilt happy harm hate hope horse house hour hunger ill joy laugh
law light lips live look lose mad master mercy mind moon murder music nature neck oath open pain pale pardon
pity plague play pray pride proud rage rain rest rich ring rise river rose royal sad safe sea seek shame
sick sigh silver sin sleep smile soft soul sound spirit star state storm strange strength strike summer sun
swear tear tears tender thought throne time tomorrow traitor treason trust truth tyrant uncle valiant virtue
voice wake walk water weep wife wind wine winter wise woe woman wonder world wound wrong""".split()
PUNCTUATION = [",", ",", ",", ".", ".", ";", ":", "?", "!", "'"]


def stand_in_text(characters=200_000, seed=0):
    """About `characters` characters of made-up plays (deterministic for a seed)."""
    rng = random.Random(seed)
    speaker_weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(SPEAKERS))]
    word_weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(WORDS))]
    speeches, total = [], 0
    while total < characters:
        speaker = rng.choices(SPEAKERS, speaker_weights)[0]
        lines = []
        for _ in range(rng.choice([1, 1, 2, 2, 3, 4, 5, 6, 8])):
            words = rng.choices(WORDS, word_weights, k=rng.randint(4, 10))
            words[0] = words[0].capitalize()
            line = " ".join(w.capitalize() if rng.random() < 0.06 else w for w in words)
            if rng.random() < 0.3:
                cut = rng.randint(1, len(words) - 1)
                line = " ".join(words[:cut]) + rng.choice(PUNCTUATION[:3]) + " " + " ".join(words[cut:])
            lines.append(line + rng.choice(PUNCTUATION))
        speech = f"{speaker}:\n" + "\n".join(lines)
        speeches.append(speech)
        total += len(speech) + 2
    return "\n\n".join(speeches)[:characters]
