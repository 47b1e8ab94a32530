/* Fuzz target: the card-number scanner (common/core/card_data).
 * Properties: found and mask agree; masking keeps the length, turns digits
 * into '*' and nothing else, keeps four digits of each number, and leaves
 * nothing the scanner would report again; a number found stays found with
 * other digits next to it ("1 " before, " 1" after). Shown text's mask
 * (card_data_mask_loose, any separators) keeps the length, turns digits
 * into '*' and nothing else, masks at least what the scanner's mask does,
 * and leaves nothing the scanner would report. */
#include "card_data.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = fuzz_strndup(data, size);
    int found = card_data_found(buf, size);
    size_t masked = card_data_mask(buf, size);

    FUZZ_CHECK(found == (masked > 0));
    size_t changed = 0;
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == (char)data[i])
            continue;
        FUZZ_CHECK(data[i] >= '0' && data[i] <= '9' && buf[i] == '*');
        changed++;
    }
    FUZZ_CHECK(buf[size] == '\0');
    /* 13..19 digits each, 4 kept: 9..15 masked per number. */
    FUZZ_CHECK(changed >= masked * 9 && changed <= masked * 15);
    FUZZ_CHECK(!card_data_found(buf, size));
    FUZZ_CHECK(card_data_mask(buf, size) == 0);
    char *loose = fuzz_strndup(data, size);
    size_t lmasked = card_data_mask_loose(loose, size);
    FUZZ_CHECK(lmasked >= masked);
    for (size_t i = 0; i < size; i++)
        FUZZ_CHECK(loose[i] == (char)data[i] ||
                   (data[i] >= '0' && data[i] <= '9' && loose[i] == '*'));
    FUZZ_CHECK(loose[size] == '\0');
    FUZZ_CHECK(!card_data_found(loose, size));
    free(loose);
    if (found) {
        char *wrapped = malloc(size + 4);
        FUZZ_CHECK(wrapped);
        memcpy(wrapped, "1 ", 2);
        memcpy(wrapped + 2, data, size);
        memcpy(wrapped + 2 + size, " 1", 2);
        FUZZ_CHECK(card_data_found(wrapped, size + 4));
        free(wrapped);
    }
    free(buf);
    return 0;
}
