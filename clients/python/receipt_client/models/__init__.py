"""The API's schemas as pydantic models: the parts of one generated module."""

from receipt_client.models._part1 import *
from receipt_client.models._part2 import *
from receipt_client.models._part3 import *
from receipt_client.models._part4 import *
