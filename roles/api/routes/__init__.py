"""The API's routes, one module per resource; each exposes an APIRouter as `router`."""
