"""Seed environment (tool use): book the earliest slot free for everyone."""

import json
import random


def _call(name, **arguments):
  return (
      "<tool_call>"
      + json.dumps({"name": name, "arguments": arguments})
      + "</tool_call>"
  )


_PEOPLE = ["maya", "omar", "lena", "tariq", "sofia", "ivan"]
_DAYS = ["monday", "tuesday", "wednesday"]


class CalendarBookingEnv(ToolUseBaseEnv):
  """A calendar assistant books a one-hour meeting for three colleagues.

  Read each person's busy hours on the given day, book the earliest hour
  (9-16 start) when all three are free, and answer the booking id.
  """

  def __init__(self, max_turns=8, **kwargs):
    super().__init__(max_turns=max_turns, **kwargs)

  def reset(self, seed=None):
    rng = random.Random(seed)
    self.turn_count = 0
    self._call_history = []
    while True:
      busy = {
          p: {d: sorted(rng.sample(range(9, 17), 4)) for d in _DAYS}
          for p in _PEOPLE
      }
      team = rng.sample(_PEOPLE, 3)
      day = rng.choice(_DAYS)
      free = [
          h for h in range(9, 17) if all(h not in busy[p][day] for p in team)
      ]
      if free and free[0] > 9:
        break
    self._team, self._day, self._slot = team, day, free[0]
    self._state = {"busy": busy, "bookings": {}}
    self._expected_answer = self._booking_id(day, free[0])
    self._tools = {
        "get_busy_hours": {
            "description": "Hours (start times) a person is busy on a day",
            "parameters": {
                "type": "object",
                "properties": {
                    "person": {"type": "string"},
                    "day": {"type": "string"},
                },
                "required": ["person", "day"],
            },
        },
        "book_meeting": {
            "description": "Book a one-hour meeting; returns a booking id",
            "parameters": {
                "type": "object",
                "properties": {
                    "day": {"type": "string"},
                    "hour": {"type": "integer"},
                },
                "required": ["day", "hour"],
            },
        },
    }
    return (
        f"TASK: Book a one-hour meeting on {day} for {', '.join(team)} at the"
        " earliest hour when all three are free (start hours 9 to 16). Answer"
        " with the booking id: <answer>BK-...</answer>.",
        {},
    )

  def _booking_id(self, day, hour):
    return f"BK-{day[:3].upper()}-{hour:02d}{len(day) * 7 + hour * 13:03d}"

  def tool_get_busy_hours(self, person="", day=""):
    person, day = str(person).lower(), str(day).lower()
    if person not in self._state["busy"] or day not in _DAYS:
      return f"Error: unknown person {person!r} or day {day!r}"
    return json.dumps(self._state["busy"][person][day])

  def tool_book_meeting(self, day="", hour=0):
    day = str(day).lower()
    try:
      hour = int(hour)
    except (TypeError, ValueError):
      return "Error: hour must be an integer"
    if day not in _DAYS or not 9 <= hour <= 16:
      return "Error: day must be monday-wednesday and hour 9-16"
    clash = [p for p in self._team if hour in self._state["busy"][p][day]]
    if clash:
      return f"Error: {', '.join(clash)} busy at {hour}:00"
    bid = self._booking_id(day, hour)
    self._state["bookings"][bid] = (day, hour)
    return f"Booked {day} {hour}:00. Booking id: {bid}"

  def hint(self):
    return f"The earliest common free hour is after {self._slot - 1}:00."

  def solution(self):
    return [
        _call("get_busy_hours", person=p, day=self._day) for p in self._team
    ] + [
        _call("book_meeting", day=self._day, hour=self._slot),
        f"<answer>{self._expected_answer}</answer>",
    ]
