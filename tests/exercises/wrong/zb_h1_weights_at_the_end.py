"""A wrong zb_h1: every W left for the end of its rank's batch."""


def place_weights(orders):
    return [[item for item in order if item[0] != "W"] + [item for item in order if item[0] == "W"]
            for order in orders]
