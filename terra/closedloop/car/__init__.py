"""How a policy's plan moves the ego car, the same in every world.

vehicle.py: the car's body (a kinematic bicycle with actuator lags and limits, and its size). path.py: a plan as a
tracked path (where along it the car should be, and when). tracking.py: the controller that follows that path
(pure pursuit and a speed loop) with steering and acceleration commands. motion.py: the two vehicles behind one
interface (``bicycle``: tracked; ``exact``: the plan's own poses), chosen by ``vehicle=``.
"""
