"""The verifier's checks, with the standard library only (no pytest, no network)."""

import sys
import unittest

sys.path.insert(0, "/app")

import stats


class MedianTest(unittest.TestCase):
    def test_odd_unsorted(self):
        self.assertEqual(stats.median([9, 1, 5]), 5)

    def test_even_is_mean_of_middle_pair(self):
        self.assertEqual(stats.median([4, 1, 3, 2]), 2.5)

    def test_single(self):
        self.assertEqual(stats.median([7]), 7)

    def test_negative_and_float(self):
        self.assertAlmostEqual(stats.median([-1.5, 10.0, 2.5]), 2.5)

    def test_input_not_modified(self):
        values = [3, 1, 2]
        stats.median(values)
        self.assertEqual(values, [3, 1, 2])

    def test_mean_still_works(self):
        self.assertEqual(stats.mean([1, 2, 3, 4]), 2.5)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
