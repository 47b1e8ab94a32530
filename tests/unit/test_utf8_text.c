/* Unit tests of common/core/utf8_text: what reaches the database from outside is
 * valid UTF-8, without control characters, and never cut mid-character. */
#include <check.h>
#include <string.h>

#include "test_env.h"
#include "utf8_text.h"

START_TEST(cut_never_splits_a_character)
{
    char src[400], dst[256];
    /* "pm_x" then 120 x "é" (2 bytes each), as a provider quotes it back. */
    strcpy(src, "No such PaymentMethod: 'pm_x");
    for (int i = 0; i < 120; i++)
        strcat(src, "\xc3\xa9");
    strcat(src, "'");
    for (size_t size = 1; size <= sizeof(dst); size++) {
        size_t n = utf8_text_copy(dst, size, src);
        ck_assert_uint_lt(n, size);
        ck_assert_uint_eq(strlen(dst), n);
        ck_assert_msg(utf8_text_valid(dst, n), "size %zu left invalid UTF-8", size);
        ck_assert_int_eq(strncmp(dst, src, n), 0);
    }
}
END_TEST

START_TEST(invalid_bytes_and_controls_are_replaced)
{
    char dst[64];
    utf8_text_copy(dst, sizeof(dst),
                   "a\xff"
                   "b\xc3(c\x01\n\x7f"
                   "d\xc2\x85"
                   "e");
    ck_assert_str_eq(dst, "a?b?(c   d e");
    /* Overlong '/', a surrogate, and a code point past U+10FFFF. */
    utf8_text_copy(dst, sizeof(dst), "\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80");
    ck_assert_str_eq(dst, "??|???|????");
    utf8_text_copy(dst, sizeof(dst), "\xf0\x9f\x92\xb3 ok \xe2\x82\xac");
    ck_assert_str_eq(dst, "\xf0\x9f\x92\xb3 ok \xe2\x82\xac");
}
END_TEST

START_TEST(invisible_format_characters_are_replaced)
{
    char dst[64];
    /* RLO, ZWSP, LRI, BOM around text; a visible non-ASCII letter stays. */
    utf8_text_copy(dst, sizeof(dst),
                   "a\xe2\x80\xae"
                   "b\xe2\x80\x8b"
                   "c\xe2\x81\xa6"
                   "d\xef\xbb\xbf"
                   "e\xe2\x82\xac");
    ck_assert_str_eq(dst, "a b c d e\xe2\x82\xac");
}
END_TEST

START_TEST(edges)
{
    char dst[4] = "xyz";
    ck_assert_uint_eq(utf8_text_copy(dst, 0, "abc"), 0);
    ck_assert_str_eq(dst, "xyz"); /* untouched */
    ck_assert_uint_eq(utf8_text_copy(dst, 1, "abc"), 0);
    ck_assert_str_eq(dst, "");
    ck_assert_uint_eq(utf8_text_copy(dst, sizeof(dst), NULL), 0);
    ck_assert_uint_eq(utf8_text_copy(dst, sizeof(dst), "\xe2\x82\xac"), 3);
    ck_assert_uint_eq(utf8_text_copy(dst, 3, "\xe2\x82\xac"), 0);
    ck_assert(!utf8_text_valid("a\0b", 3));
    ck_assert(utf8_text_valid("", 0));
}
END_TEST

START_TEST(characters_are_code_points)
{
    ck_assert_uint_eq(utf8_text_chars("", 0), 0);
    ck_assert_uint_eq(utf8_text_chars("pm_card_visa", 12), 12);
    /* é (2 bytes), € (3), 💳 (4): one character each, as JSON Schema counts. */
    ck_assert_uint_eq(utf8_text_chars("\xc3\xa9\xe2\x82\xac\xf0\x9f\x92\xb3", 9), 3);
    /* Counts only the n bytes given. */
    ck_assert_uint_eq(utf8_text_chars("\xc3\xa9x", 2), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("utf8_text");
    TCase *tc = tcase_create("utf8_text");
    tcase_add_test(tc, cut_never_splits_a_character);
    tcase_add_test(tc, invalid_bytes_and_controls_are_replaced);
    tcase_add_test(tc, invisible_format_characters_are_replaced);
    tcase_add_test(tc, edges);
    tcase_add_test(tc, characters_are_code_points);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
