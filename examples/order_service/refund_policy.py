"""Which paid orders the example order service refunds, by their placing
order (orders.seq): every REFUND_EVERY-th, and of those every other one in
full, the rest half. Apart from order_service.py (which needs the venv's
confluent-kafka and psycopg) so that the standard-library tools that check
it (tools/chaos, tools/demo_report.py, tests/e2e) can import it."""

REFUND_EVERY = 5


def refund_for(seq, amount):
    """(amount, reason) of the refund order number seq asks for once paid,
    or None when it keeps its money."""
    if seq % REFUND_EVERY != 0:
        return None
    if seq % (2 * REFUND_EVERY) == 0:
        return amount, "requested_by_customer"
    if amount // 2 == 0:
        return None  # half of 1 minor unit is nothing to refund
    return amount // 2, "duplicate"
