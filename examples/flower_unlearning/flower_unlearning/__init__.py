"""A Flower app (Message API) whose clients can ask to be forgotten: SCALE serves them."""
