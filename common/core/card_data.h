/* card_data: finds and masks payment card numbers (PANs) in raw bytes.
 *
 * A card number is a run of 13..19 digits, ungrouped or grouped the way
 * cards are printed (4-4-4-4, 4-6-5, with single spaces or hyphens), that
 * starts with 2..6 (the networks' ranges), is not part of a longer token
 * (a UUID, an id) and passes the Luhn check. Amounts (at most 12 digits),
 * UUIDs and millisecond timestamps (starting with 1) do not look like one. Commands
 * must never carry card digits: charged refuses them and masks them wherever it keeps
 * or prints the command. */
#ifndef CHARGED_CARD_DATA_H
#define CHARGED_CARD_DATA_H

#include <stddef.h>

/* 1 if buf holds a card number. */
int card_data_found(const char *buf, size_t len);

/* Overwrites every digit of each card number in buf, except the last four,
 * with '*', in place, until card_data_found() finds none; the length is
 * unchanged. Returns how many it masked. */
size_t card_data_mask(char *buf, size_t len);

/* For what is shown to people: card_data_mask, then every number of 13..19
 * digits that starts with 2..6 and passes the Luhn check is masked the same
 * way, whatever stands around it (track data puts a letter right before
 * the number: "%B4242424242424242^") and however its digits are grouped:
 * whole groups of digits joined by runs of anything but letters, digits
 * and '*' (a space, two, a TAB, '-', '.', '/', '_', the bytes of NBSP or
 * of a zero-width space) count as one number, "4242\t4242\t4242\t4242" as
 * "4242 4242 4242 4242". Only a UUID's groups are never read as one (an id,
 * and charged matches ids). The price: masking an id or a date that only
 * looks like a card. Returns how many it masked. Never used to decide
 * whether a command holds card data. */
size_t card_data_mask_loose(char *buf, size_t len);

/* The one way provider text (a code, a decline code, a status, a message,
 * metadata: anyone's to write) enters charged's records and outputs:
 * copies src (NULL reads as "") into dst of size bytes as utf8_text_copy
 * does, its card numbers masked as card_data_mask_loose masks them: in the
 * text as utf8_text_copy makes it (a control or invisible character
 * between groups becomes the space of a printed card), on the whole text,
 * so that a number the bound cuts is masked all the same. Provider object
 * ids are not text: they are copied as they are. Returns how many it
 * masked. */
size_t card_data_copy_masked(char *dst, size_t size, const char *src);

#endif
