"""SPADE's own held-out function-calling items, used when BFCL is unavailable.

Written for evaluation only (nothing here is in the seed library or the
designer's examples) in BFCL's single-turn format, so `bfcl.check_calls`
scores them: a question, the functions offered, and for each parameter the
list of acceptable values ("" marks an optional one). Half offer one
function (like BFCL `simple`), half several (like BFCL `multiple`).
"""

from __future__ import annotations


def _fn(name, description, properties, required):
  return {
      "name": name,
      "description": description,
      "parameters": {
          "type": "dict",
          "properties": properties,
          "required": list(required),
      },
  }


_WEATHER = _fn(
    "get_weather",
    "Current weather in a city.",
    {
        "city": {"type": "string", "description": "City name."},
        "unit": {
            "type": "string",
            "description": "celsius or fahrenheit (default celsius).",
        },
    },
    ["city"],
)
_CONVERT = _fn(
    "convert_currency",
    "Convert an amount of money between currencies.",
    {
        "amount": {"type": "float", "description": "Amount to convert."},
        "from_currency": {"type": "string", "description": "ISO code."},
        "to_currency": {"type": "string", "description": "ISO code."},
    },
    ["amount", "from_currency", "to_currency"],
)
_TIMER = _fn(
    "set_timer",
    "Start a countdown timer.",
    {
        "minutes": {"type": "integer", "description": "Length in minutes."},
        "label": {"type": "string", "description": "Optional label."},
    },
    ["minutes"],
)
_EMAIL = _fn(
    "send_email",
    "Send an email.",
    {
        "to": {"type": "string", "description": "Recipient address."},
        "subject": {"type": "string", "description": "Subject line."},
        "body": {"type": "string", "description": "Message text."},
    },
    ["to", "subject", "body"],
)
_GCD = _fn(
    "math_gcd",
    "Greatest common divisor of two integers.",
    {
        "a": {"type": "integer", "description": "First number."},
        "b": {"type": "integer", "description": "Second number."},
    },
    ["a", "b"],
)
_SORT = _fn(
    "sort_numbers",
    "Sort a list of numbers.",
    {
        "numbers": {
            "type": "array",
            "items": {"type": "float"},
            "description": "The numbers.",
        },
        "descending": {
            "type": "boolean",
            "description": "Largest first (default false).",
        },
    },
    ["numbers"],
)
_FLIGHT = _fn(
    "search_flights",
    "Find flights between two airports on a date.",
    {
        "origin": {"type": "string", "description": "IATA code."},
        "destination": {"type": "string", "description": "IATA code."},
        "date": {"type": "string", "description": "YYYY-MM-DD."},
        "passengers": {
            "type": "integer",
            "description": "Number of travellers (default 1).",
        },
    },
    ["origin", "destination", "date"],
)
_BMI = _fn(
    "calculate_bmi",
    "Body mass index from weight and height.",
    {
        "weight_kg": {"type": "float", "description": "Weight in kg."},
        "height_m": {"type": "float", "description": "Height in metres."},
    },
    ["weight_kg", "height_m"],
)


def _item(item_id, question, functions, truth):
  return {
      "id": item_id,
      "question": [[{"role": "user", "content": question}]],
      "function": functions,
      "ground_truth": [truth],
  }


ITEMS = (
    _item(
        "spade_simple_0",
        "What's the weather like in Lisbon right now?",
        [_WEATHER],
        {"get_weather": {"city": ["Lisbon"], "unit": ["", "celsius"]}},
    ),
    _item(
        "spade_multiple_0",
        "How many yen do I get for 250 US dollars?",
        [_WEATHER, _CONVERT, _TIMER],
        {
            "convert_currency": {
                "amount": [250.0],
                "from_currency": ["USD"],
                "to_currency": ["JPY"],
            }
        },
    ),
    _item(
        "spade_simple_1",
        "Set a 25 minute timer labelled pomodoro.",
        [_TIMER],
        {"set_timer": {"minutes": [25], "label": ["pomodoro"]}},
    ),
    _item(
        "spade_multiple_1",
        "Email ana@example.com with subject 'Lunch' saying 'Noon at the"
        " usual place?'",
        [_EMAIL, _TIMER, _FLIGHT],
        {
            "send_email": {
                "to": ["ana@example.com"],
                "subject": ["Lunch"],
                "body": ["Noon at the usual place?"],
            }
        },
    ),
    _item(
        "spade_simple_2",
        "Compute the greatest common divisor of 84 and 36.",
        [_GCD],
        {"math_gcd": {"a": [84], "b": [36]}},
    ),
    _item(
        "spade_multiple_2",
        "Sort 3.5, -1, 10 and 2 from largest to smallest.",
        [_GCD, _SORT, _BMI],
        {
            "sort_numbers": {
                "numbers": [[3.5, -1.0, 10.0, 2.0]],
                "descending": [True],
            }
        },
    ),
    _item(
        "spade_simple_3",
        "Find flights from OSL to BCN on 2026-03-14 for 2 people.",
        [_FLIGHT],
        {
            "search_flights": {
                "origin": ["OSL"],
                "destination": ["BCN"],
                "date": ["2026-03-14"],
                "passengers": [2],
            }
        },
    ),
    _item(
        "spade_multiple_3",
        "I weigh 70 kg and I am 1.75 m tall. What is my BMI?",
        [_WEATHER, _BMI, _CONVERT],
        {"calculate_bmi": {"weight_kg": [70.0], "height_m": [1.75]}},
    ),
    _item(
        "spade_simple_4",
        "Convert 19.99 euros to British pounds.",
        [_CONVERT],
        {
            "convert_currency": {
                "amount": [19.99],
                "from_currency": ["EUR"],
                "to_currency": ["GBP"],
            }
        },
    ),
    _item(
        "spade_multiple_4",
        "Is it cold in Oslo? Give me the temperature in fahrenheit.",
        [_FLIGHT, _WEATHER, _TIMER],
        {"get_weather": {"city": ["Oslo"], "unit": ["fahrenheit"]}},
    ),
    _item(
        "spade_simple_5",
        "Sort these numbers ascending: 9, 4, 7.",
        [_SORT],
        {
            "sort_numbers": {
                "numbers": [[9.0, 4.0, 7.0]],
                "descending": ["", False],
            }
        },
    ),
    _item(
        "spade_multiple_5",
        "What is the GCD of 1071 and 462?",
        [_SORT, _EMAIL, _GCD],
        {"math_gcd": {"a": [1071], "b": [462]}},
    ),
)
