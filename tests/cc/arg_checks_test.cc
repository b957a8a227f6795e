// The out-row overlap check (arg_checks.h CheckDisjointRows) against a brute-force count of
// every pair of rows: it refuses exactly the layouts in which two rows share an element,
// interleaved ones included (rows of one token between those of another).
#include "cc/splitkv/arg_checks.h"

#include <cstdint>
#include <string>

#include "cc/splitkv/errors.h"
#include "tests/cc/test_check.h"

namespace {

bool BruteForceOverlap(int64_t tokens, int64_t stride_token, int64_t heads, int64_t stride_head, int64_t length) {
  for (int64_t a = 0; a < tokens * heads; ++a) {
    for (int64_t b = a + 1; b < tokens * heads; ++b) {
      const int64_t x = (a / heads) * stride_token + (a % heads) * stride_head;
      const int64_t y = (b / heads) * stride_token + (b % heads) * stride_head;
      if (x < y + length && y < x + length) return true;
    }
  }
  return false;
}

bool Refused(int64_t tokens, int64_t stride_token, int64_t heads, int64_t stride_head, int64_t length) {
  try {
    splitkv::CheckDisjointRows(splitkv::ArgChecks("test"), "out", tokens, stride_token, heads, stride_head, length);
  } catch (const splitkv::InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.find("test: out strides overlap") != std::string::npos);
    return true;
  }
  return false;
}

TEST(DisjointRowsMatchesBruteForce) {
  int64_t cases = 0, refused = 0;
  for (int64_t tokens = 0; tokens <= 5; ++tokens) {
    for (int64_t heads = 0; heads <= 5; ++heads) {
      for (int64_t length = 1; length <= 6; ++length) {
        for (int64_t stride_token = 0; stride_token <= 40; ++stride_token) {
          for (int64_t stride_head = 0; stride_head <= 40; ++stride_head) {
            const bool expected = BruteForceOverlap(tokens, stride_token, heads, stride_head, length);
            const bool got = Refused(tokens, stride_token, heads, stride_head, length);
            if (got != expected) {
              EXPECT_EQ(expected, got);
              return;
            }
            ++cases;
            refused += got;
          }
        }
      }
    }
  }
  // Both answers occur, and the layout the nested check refused: strides (36, 20), 3 heads of 4.
  EXPECT_TRUE(refused > 0 && refused < cases);
  EXPECT_TRUE(!Refused(3, 36, 3, 20, 4));
  EXPECT_TRUE(Refused(3, 36, 3, 20, 17));
}

TEST(DisjointRowsLargeCounts) {
  // Many tokens interleaved with few heads (the loop runs over the heads), and the reverse.
  EXPECT_TRUE(!Refused(1'000'000, 3, 3, 1'000'000 * 3, 3));
  EXPECT_TRUE(Refused(1'000'000, 3, 3, 1'000'000 * 3 - 1, 3));
  EXPECT_TRUE(!Refused(4, 1, 1'000'000, 4, 1));
  EXPECT_TRUE(Refused(4, 1, 1'000'000, 3, 1));
  EXPECT_TRUE(!Refused(2, 5, 2, 10, 5));  // rows at 0, 10, 5, 15
  // Interleaved for any token count: 20 * dh + 36 * dt is a multiple of 4, zero only at 0.
  EXPECT_TRUE(!Refused(1'000'000, 36, 3, 20, 4));
  EXPECT_TRUE(!Refused(1'000'000, 36, 9, 20, 4));
  EXPECT_TRUE(Refused(1'000'000, 36, 10, 20, 4));  // head 9 of token 0 is head 0 of token 5
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
