/* money: an amount in minor units, written as people read money:
 * 1500 EUR is "15.00 EUR", 1500 JPY "1500 JPY", 1500 KWD "1.500 KWD".
 *
 * The number of digits after the point is the currency's ISO 4217 minor
 * unit (its exponent); a currency the table does not name has 2, as most
 * do. The console's page formats the same way
 * (worker/roles/console_web/money.js); tests/unit/money_cases.txt holds the
 * cases both are tested with. */
#ifndef CHARGED_MONEY_H
#define CHARGED_MONEY_H

#include <stddef.h>

/* ISO 4217 minor-unit digits of an upper-case code: 0, 2, 3 or 4. */
int money_exponent(const char *currency);

/* "15.00 EUR" into out (size bytes); a NULL or empty currency writes the
 * number alone (with 2 digits). Returns the length, or -1 when it does not
 * fit (out then holds ""). */
int money_format(char *out, size_t size, long long minor, const char *currency);

#endif
