"""The `file-edit` workload of the speculative benchmark: OpenAI Predicted Outputs on a whole
file, the way an editor sends an edit. A 200-line Python module, one rename per request
(an identifier used 4 or 5 times), the reply asked to be the whole file, and the file itself as
the `prediction`: nearly every output token is a copy, so drafts are long and mostly
accepted. Each user renames something else (`RENAMES`, in turn).
"""

from __future__ import annotations

RENAMES = [("reorder_point", "restock_level"), ("Shipment", "Delivery"),
           ("_round_money", "_to_cents")]

SOURCE = '''"""A small inventory service: products, stock levels, orders and shipments."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal


class InventoryError(Exception):
    """Raised when an operation would leave the inventory inconsistent."""


@dataclass
class Product:
    sku: str
    name: str
    unit_price: Decimal
    reorder_point: int = 10
    discontinued: bool = False

    def price_for(self, quantity: int) -> Decimal:
        if quantity <= 0:
            raise InventoryError(f"quantity must be positive, got {quantity}")
        return _round_money(self.unit_price * quantity)


@dataclass
class StockLevel:
    product: Product
    on_hand: int = 0
    reserved: int = 0

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved

    def needs_reorder(self) -> bool:
        return self.available <= self.product.reorder_point


@dataclass
class OrderLine:
    sku: str
    quantity: int
    price: Decimal = Decimal("0")


@dataclass
class Order:
    order_id: str
    customer: str
    lines: list[OrderLine] = field(default_factory=list)
    placed_on: date = field(default_factory=date.today)
    status: str = "open"

    def total(self) -> Decimal:
        return _round_money(sum((line.price for line in self.lines), Decimal("0")))


@dataclass
class Shipment:
    order_id: str
    carrier: str
    shipped_on: date
    tracking: str = ""

    def expected_arrival(self, transit_days: int = 3) -> date:
        arrival = self.shipped_on + timedelta(days=transit_days)
        while arrival.weekday() >= 5:
            arrival += timedelta(days=1)
        return arrival


def _round_money(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


class Inventory:
    def __init__(self) -> None:
        self.stock: dict[str, StockLevel] = {}
        self.orders: dict[str, Order] = {}
        self.shipments: list[Shipment] = []

    def add_product(self, product: Product, on_hand: int = 0) -> None:
        if product.sku in self.stock:
            raise InventoryError(f"duplicate sku {product.sku}")
        self.stock[product.sku] = StockLevel(product, on_hand=on_hand)

    def receive(self, sku: str, quantity: int) -> int:
        level = self._level(sku)
        if quantity <= 0:
            raise InventoryError(f"cannot receive {quantity} units of {sku}")
        level.on_hand += quantity
        return level.on_hand

    def place_order(self, order: Order) -> Order:
        if order.order_id in self.orders:
            raise InventoryError(f"order {order.order_id} already exists")
        for line in order.lines:
            level = self._level(line.sku)
            if level.product.discontinued:
                raise InventoryError(f"{line.sku} is discontinued")
            if level.available < line.quantity:
                raise InventoryError(
                    f"only {level.available} of {line.sku} available, "
                    f"{line.quantity} ordered")
        for line in order.lines:
            level = self._level(line.sku)
            level.reserved += line.quantity
            line.price = level.product.price_for(line.quantity)
        self.orders[order.order_id] = order
        return order

    def cancel_order(self, order_id: str) -> None:
        order = self._order(order_id)
        if order.status != "open":
            raise InventoryError(f"order {order_id} is {order.status}")
        for line in order.lines:
            self._level(line.sku).reserved -= line.quantity
        order.status = "cancelled"

    def ship(self, order_id: str, carrier: str, shipped_on: date) -> Shipment:
        order = self._order(order_id)
        if order.status != "open":
            raise InventoryError(f"order {order_id} is {order.status}")
        for line in order.lines:
            level = self._level(line.sku)
            level.reserved -= line.quantity
            level.on_hand -= line.quantity
        order.status = "shipped"
        shipment = Shipment(order_id, carrier, shipped_on)
        shipment.tracking = f"{carrier[:3].upper()}-{order_id}-{shipped_on:%Y%m%d}"
        self.shipments.append(shipment)
        return shipment

    def low_stock(self) -> list[str]:
        return sorted(sku for sku, level in self.stock.items() if level.needs_reorder())

    def reorder_quantities(self, cover: int = 2) -> dict[str, int]:
        plan = {}
        for sku in self.low_stock():
            level = self.stock[sku]
            if level.product.discontinued:
                continue
            target = level.product.reorder_point * cover
            plan[sku] = max(target - level.available, 0)
        return plan

    def stock_value(self) -> Decimal:
        total = Decimal("0")
        for level in self.stock.values():
            total += level.product.unit_price * level.on_hand
        return _round_money(total)

    def orders_for(self, customer: str) -> list[Order]:
        found = [o for o in self.orders.values() if o.customer == customer]
        return sorted(found, key=lambda o: (o.placed_on, o.order_id))

    def revenue(self, start: date, end: date) -> Decimal:
        total = Decimal("0")
        for order in self.orders.values():
            if order.status == "shipped" and start <= order.placed_on <= end:
                total += order.total()
        return total

    def late_shipments(self, today: date, transit_days: int = 3) -> list[Shipment]:
        return [s for s in self.shipments if s.expected_arrival(transit_days) < today]

    def _level(self, sku: str) -> StockLevel:
        try:
            return self.stock[sku]
        except KeyError:
            raise InventoryError(f"unknown sku {sku}") from None

    def _order(self, order_id: str) -> Order:
        try:
            return self.orders[order_id]
        except KeyError:
            raise InventoryError(f"unknown order {order_id}") from None


def to_json(inventory: Inventory) -> str:
    data = {
        "stock": [
            {
                "sku": sku,
                "name": level.product.name,
                "unit_price": str(level.product.unit_price),
                "reorder_point": level.product.reorder_point,
                "on_hand": level.on_hand,
                "reserved": level.reserved,
            }
            for sku, level in sorted(inventory.stock.items())
        ],
        "open_orders": sorted(o.order_id for o in inventory.orders.values()
                              if o.status == "open"),
    }
    return json.dumps(data, indent=2)
'''


def prompt_text(i: int) -> tuple[str, str]:
    """User `i`'s request and the expected reply's code block: (prompt text, prediction
    text)."""
    old, new = RENAMES[i % len(RENAMES)]
    block = f"```python\n{SOURCE}```"
    return (f"Rename `{old}` to `{new}` everywhere in the file below. Reply with the whole "
            f"file, changed, in one code block, and nothing else.\n\n{block}", block)
