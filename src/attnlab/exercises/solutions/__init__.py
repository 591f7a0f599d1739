"""Reference solutions of the exercises, one file each: the checker runs them as it runs a reader's file
(``attnlab exercise ID --solution`` prints one), and the test suite checks that each passes."""
